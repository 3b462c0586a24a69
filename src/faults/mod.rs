//! The fault injector: named fault points, seeded decisions, and a log of
//! everything that fired.
//!
//! A decision is a pure function of (seed, fault point, occurrence): the n-th
//! time any component reaches `relay.after_produce` gets the same answer on
//! every run with the same seed, whatever the backend. Which relay reaches it
//! n-th depends on thread scheduling, which no seed controls.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Declares every fault point once: its variant, its name, the scenario
/// key that sets its probability, what one occurrence is, who strikes it
/// (and so what a run needs for it), whether the nemesis timeline may
/// schedule it, how its effect is confirmed, what happens, and what the
/// harness sees. The list of points, the scenario's `[faults]` keys with
/// their defaults, the rates, the preflight rules and docs/fault-points.md
/// are all generated from this table, so a new fault point is one entry
/// here plus the place that strikes it.
macro_rules! fault_points {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $name:literal, key $key:ident, per $unit:literal, by $strike:ident $(+ $sched:ident)?,
        confirm $confirm:ident, what $what:literal, confirmed by $confirmed:literal;
    )+) => {
        /// Every place the injector may strike.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum FaultPoint {
            $($(#[$doc])* $variant,)+
        }

        impl FaultPoint {
            /// Every point, in declaration (and so discriminant) order.
            pub const ALL: &'static [FaultPoint] = &[$(FaultPoint::$variant),+];

            pub fn name(self) -> &'static str {
                match self { $(FaultPoint::$variant => $name,)+ }
            }

            /// Its key in a scenario's `[faults]` table.
            pub fn key(self) -> &'static str {
                match self { $(FaultPoint::$variant => stringify!($key),)+ }
            }

            /// What one occurrence is: the unit the probability applies to.
            pub fn unit(self) -> &'static str {
                match self { $(FaultPoint::$variant => $unit,)+ }
            }

            /// How the harness confirms that a firing of this point had its
            /// effect: the chaos counts only once it is seen.
            pub fn confirmed_by(self) -> &'static str {
                match self { $(FaultPoint::$variant => $confirmed,)+ }
            }

            /// Who strikes it, and so what a run needs for it.
            pub fn strike(self) -> Strike {
                match self { $(FaultPoint::$variant => Strike::$strike,)+ }
            }

            /// Which effect confirms a firing.
            pub fn confirm(self) -> Confirm {
                match self { $(FaultPoint::$variant => Confirm::$confirm,)+ }
            }

            /// What happens when it fires, for people (docs/fault-points.md).
            pub fn what(self) -> &'static str {
                match self { $(FaultPoint::$variant => $what,)+ }
            }

            /// Whether a `[[nemesis.timeline]]` entry may schedule it.
            pub fn schedulable(self) -> bool {
                match self { $(FaultPoint::$variant => false $(|| stringify!($sched) == "schedulable")?,)+ }
            }
        }

        /// The `[faults]` table as written: a probability per fault point,
        /// keyed by its name with `_` for `.`; 0 when absent.
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct RawFaults {
            $($(#[$doc])* pub $key: toml::Spanned<f64>,)+
        }

        impl Default for RawFaults {
            fn default() -> Self {
                Self { $($key: toml::Spanned::new(0..0, 0.0),)+ }
            }
        }

        impl RawFaults {
            /// A point's probability as written, with where it was written.
            pub fn get(&self, point: FaultPoint) -> &toml::Spanned<f64> {
                match point { $(FaultPoint::$variant => &self.$key,)+ }
            }
        }
    };
}

fault_points! {
    /// A relay crashes after the broker acked its batch and before it marks
    /// the rows published: the batch will be published again.
    RelayAfterProduce = "relay.after_produce", key relay_after_produce, per "batch", by Relay, confirm TopicCopies,
        what "the relay crashes after the broker acked the batch and before it marks the rows published; the batch is published again",
        confirmed by "the crashed batch's first event on the topic twice";
    /// A notifier crashes after its inbox transaction committed and before it
    /// commits the offsets: the batch will be delivered again.
    NotifierBeforeOffsetCommit = "notifier.before_offset_commit", key notifier_before_offset_commit, per "event", by Notifier, confirm Redelivery,
        what "the notifier crashes after its inbox transaction committed and before it commits the offsets; the group redelivers the batch",
        confirmed by "the batch's first message delivered again";
    /// The payment service writes a malformed event next to a real one.
    WorkloadPoison = "workload.poison", key workload_poison, per "payment", by Workload, confirm Seen,
        what "the payment service also writes a malformed event, which must end in `dead_letters`",
        confirmed by "the malformed event's dead letter";
    /// A relay crashes between its two steps, before producing: harmless when
    /// it publishes then marks, a loss when it marks first.
    RelayBeforeProduce = "relay.before_produce", key relay_before_produce, per "batch", by Relay, confirm NextIncarnation,
        what "the relay crashes between its two steps, before producing: harmless when it publishes then marks, a loss when it marks first",
        confirmed by "the relay's next incarnation";
    /// A relay stalls before producing, holding its claim, so other relays
    /// publish later events first: reordering on the topic.
    RelaySlowProduce = "relay.slow_produce", key relay_slow_produce, per "batch", by Relay, confirm Seen,
        what "the relay holds its claim for 300 ms before producing, so other relays publish later events first: reordering",
        confirmed by "the held claim released after the delay";
    /// A notifier crashes after the inbox claim and before the effects.
    NotifierMidBatch = "notifier.mid_batch", key notifier_mid_batch, per "batch", by Notifier, confirm Redelivery,
        what "the notifier crashes after the inbox claim and before the effects (in the correct pipeline the transaction dies with it)",
        confirmed by "the batch's first message delivered again";
    /// A notifier crashes after the email provider answered and before its
    /// transaction commits: the email went out, the receipt did not.
    NotifierAfterExternalCall = "notifier.after_external_call", key notifier_after_external_call, per "batch that sent receipt emails", by Notifier, confirm Redelivery,
        what "the notifier crashes after the email provider answered its calls and before the receipts' transaction commits: the emails went out, the receipts and the inbox claims roll back. The redelivery calls the provider again: with the same idempotency key it sends nothing new; without one, the customer gets the email twice",
        confirmed by "the batch's first message delivered again";
    /// A notifier stalls past its session timeout while holding a batch; the
    /// group gives its partitions away and the zombie then wakes up.
    NotifierStall = "notifier.stall", key notifier_stall, per "batch", by Notifier, confirm Seen,
        what "the notifier freezes holding its batch (a zombie); it is replaced, its replacement processes the same messages, then the zombie wakes and applies what it held. The drain waits for zombies",
        confirmed by "the zombie's late attempt at its batch";
    /// After a batch, the group's offsets are rewound to the start of its
    /// partitions: a late replay of everything.
    NotifierReplay = "notifier.replay", key notifier_replay, per "batch", by Notifier, confirm Redelivery,
        what "after the batch, the group's offsets are rewound to the start of its partitions: a late replay of everything",
        confirmed by "the batch's first message delivered again";
    /// The payment service crashes after its database commit and before it
    /// produces (only meaningful with `publish = "dual-write"`).
    WorkloadAfterCommit = "workload.after_commit", key workload_after_commit, per "event", by Workload, confirm Seen,
        what "with `publish = \"dual-write\"`: the payment service crashes after its commit and before it produces",
        confirmed by "the produce the crash skipped";
    /// A relay's produce fails: one message of the batch is refused, so the
    /// client reports a delivery error for it while the rest are acked. The
    /// relay must not mark the batch; it gives it back and it goes out again.
    RelayProduceError = "relay.produce_error", key relay_produce_error, per "batch", by Relay, confirm Seen,
        what "the produce fails: the batch's last message is addressed to a partition the topic does not have, so the client reports a delivery error for it (through the same path as a refused produce) while the rest are acked. The relay must not mark the batch; it gives it back",
        confirmed by "the failed batch published again";
    /// A relay crashes right after its mark committed: nothing is lost and
    /// nothing is repeated, the next incarnation just carries on.
    RelayAfterMark = "relay.after_mark", key relay_after_mark, per "batch", by Relay, confirm NextIncarnation,
        what "the relay crashes right after its mark committed: nothing is lost or repeated",
        confirmed by "the relay's next incarnation";
    /// The store refuses a reference component's commit: the transaction
    /// rolls back and the caller gets the error a refused `COMMIT` gives
    /// (a serialization failure, a deferred constraint). In process, on
    /// both backends, where no proxy reaches: SQLite has no wire.
    StoreCommitRefused = "store.commit_refused", key store_commit_refused, per "commit of a reference component", by Store, confirm Seen,
        what "the store rolls the transaction back in place of its commit and returns a database error to the caller (the payment service's authorize or capture, a relay's claim, mark or delete, a notifier's batch), on PostgreSQL and on SQLite. The correct pipeline retries or redelivers; a caller that takes the error for success loses the work",
        confirmed by "the rollback seen done in place of the commit";
    /// The harness sends SIGKILL to a component that runs as an OS process
    /// (a program under test, `[notifier] command`), at a random instant
    /// within the second: no shutdown code runs, its open transaction dies
    /// with its connection, the broker sees a member vanish.
    ProcessKill = "process.kill", key process_kill, per "second, per process", by Process, confirm Seen,
        what "the harness sends `SIGKILL` to the process group at a random instant within the second, from the moment the group is ready until the pipeline has drained, to a process PostgreSQL shows a session of (its seconds starting up are not drawn); the process is stopped first, so that the run's power line can say whether the kill found a transaction open. A new process takes the slot 200 ms later",
        confirmed by "the process seen ending by SIGKILL";
    /// The harness sends SIGSTOP to a component that runs as an OS process,
    /// and SIGCONT after `[nemesis] pause_secs`: past its session timeout it
    /// wakes up a zombie.
    ProcessPause = "process.pause", key process_pause, per "second, per process", by Process, confirm Seen,
        what "the harness sends `SIGSTOP` to a process PostgreSQL shows a session of, and `SIGCONT` after `[nemesis] pause_secs` (unset: 2 s past `[notifier] session_timeout_ms`, which the program gets as `CHAOS_SESSION_TIMEOUT_MS`); past the program's session timeout it wakes up a zombie",
        confirmed by "the process seen stopped by the kernel";
    /// The harness sends SIGKILL to one process (picked from the seed) as
    /// the topic grows: kills land while messages flow, when a consumer or
    /// a relay is busiest.
    ProcessKillPerMessage = "process.kill_per_message", key process_kill_per_message, per "message the topic gains", by Process, confirm Seen,
        what "as the topic grows (its watermarks read every 50 ms), each new message is an occurrence for one process slot picked from the seed, and a firing sends that slot's process `SIGKILL`: kills land while messages flow. A message whose slot already has a kill on its way is not an occurrence",
        confirmed by "the process seen ending by SIGKILL";
    /// The fault proxy resets every connection a component has open to
    /// the database: an RST to the component, a closed socket to the server.
    NetReset = "net.reset", key net_reset, per "second, per proxied component", by DbWire + schedulable, confirm Seen,
        what "the fault proxy resets every connection the component has open to PostgreSQL (and to Kafka, with `[proxy] kafka`): an RST to the component, a closed socket to the server, which rolls back what was open",
        confirmed by "an open connection reset by the proxy";
    /// The fault proxy holds every byte between a component and the
    /// database for `[proxy] blackhole_ms`, then lets it through: a
    /// network partition that heals.
    NetBlackhole = "net.blackhole", key net_blackhole, per "second, per proxied component", by DbWire + schedulable, confirm Seen,
        what "the fault proxy holds every byte between the component and PostgreSQL (and Kafka, with `[proxy] kafka`), both ways, for `[proxy] blackhole_ms` (default 2000), then lets them through: a partition that heals",
        confirmed by "bytes held by the proxy during the blackhole";
    /// PostgreSQL commits and its acknowledgement never arrives: the fault
    /// proxy withholds the `CommandComplete` of a COMMIT and resets the
    /// connection. The transaction is durable; its client cannot know.
    DbCommitAckLost = "db.commit_ack_lost", key db_commit_ack_lost, per "commit acknowledged to a proxied component", by DbWire, confirm Seen,
        what "the server committed (a `COMMIT`, or a write in autocommit) and the fault proxy withholds its acknowledgement (`CommandComplete` to `ReadyForQuery` idle) and resets the connection: the commit is durable, its client gets an error. An ambiguous commit",
        confirmed by "the proxy seeing the server acknowledge the COMMIT and withholding it";
    /// The fault proxy lets a COMMIT's acknowledgement through and SIGKILLs
    /// the component's process right after: for any consumer, a kill
    /// between its transaction and its offset commit.
    DbKillAfterCommit = "db.kill_after_commit", key db_kill_after_commit, per "commit that changed rows, acknowledged to a component process", by DbWireKill, confirm Seen,
        what "the fault proxy lets the acknowledgement through and the harness `SIGKILL`s the component's process at once: for any consumer, its own included, a kill between its transaction and its offset commit. Only a commit whose transaction changed rows is an occurrence (the server's tags `INSERT 0 3`, `UPDATE 1` before it): an empty or read-only commit, an idle poll, holds no work to lose. The report counts both kinds",
        confirmed by "the process seen ending by SIGKILL";
    /// The broker appends a produce's batches and its acknowledgement never
    /// arrives: the fault proxy withholds the `Produce` response and resets
    /// the connection. The producer retries: an idempotent one has the
    /// broker drop the copy; one without idempotence writes it again.
    KafkaProduceAckLost = "kafka.produce_ack_lost", key kafka_produce_ack_lost, per "produce acknowledged to a proxied component", by KafkaWire, confirm Seen,
        what "the broker appended the batches of a `Produce` request, and the fault proxy withholds its response and resets the connection. The producer retries: the reference relay's idempotent producer has the broker drop the copy (a test checks the topic holds the message once and the produce is reported failed); one without idempotence writes it again",
        confirmed by "the proxy seeing the broker answer a produce and withholding the answer";
    /// The fault proxy lets a produce's acknowledgement through and
    /// SIGKILLs the component's process right after: for any relay, a kill
    /// between the broker's ack and the outbox's mark.
    KafkaKillAfterProduceAck = "kafka.kill_after_produce_ack", key kafka_kill_after_produce_ack, per "produce acknowledged to a component process", by KafkaWireKill, confirm Seen,
        what "the fault proxy lets the `Produce` response through and the harness `SIGKILL`s the process at once: for any relay, its own included, a kill between the broker's ack and the outbox mark",
        confirmed by "the process seen ending by SIGKILL";
    /// The fault proxy lets the group coordinator's answer to an
    /// `OffsetCommit` through and SIGKILLs the component's process right
    /// after: for a consumer that commits its offsets before its database
    /// commit (by hand, or by `enable.auto.commit`), a kill inside its
    /// window, every time.
    KafkaKillAfterOffsetCommit = "kafka.kill_after_offset_commit", key kafka_kill_after_offset_commit, per "offset commit acknowledged to a component process", by KafkaWireKill, confirm Seen,
        what "the fault proxy lets the `OffsetCommit` response through and the harness `SIGKILL`s the process at once. A consumer whose offsets run ahead of its database (committed before its transaction, or by `enable.auto.commit` while a batch is being handled) loses that work; a correct one, whose offsets follow its commit, loses nothing and gets the rest again",
        confirmed by "the process seen ending by SIGKILL";
    /// The fault proxy lets a `Fetch` response that carries records through
    /// and SIGKILLs the consumer's process right after: the earliest moment
    /// of a delivery, before the program's next commit of either kind. A
    /// correct consumer gets the records again; one that acknowledges work
    /// it has only received (offsets stored or committed on receipt, a
    /// queue in memory) loses it.
    KafkaKillAfterFetch = "kafka.kill_after_fetch", key kafka_kill_after_fetch, per "fetch response carrying records to a component process", by KafkaWireKill, confirm Seen,
        what "the fault proxy reads each `Fetch` response (API key 1, versions 4 to 17) as it passes, and when one carries records it lets it through and the harness `SIGKILL`s the process at once, before the program could commit anything for them. A correct consumer has those records delivered again; one whose offsets or acknowledgements run ahead of what it has done (committed on receipt, handed to a queue in memory) loses them",
        confirmed by "the process seen ending by SIGKILL";
    /// The fault proxy holds a process's `COMMIT` and watches its Kafka
    /// wire: if the group's offsets move while the transaction is open
    /// (before, or during the hold), the process is killed before the
    /// `COMMIT` reaches the server. Only a program whose offsets run ahead
    /// of its database loses anything.
    DbHoldCommit = "db.hold_commit", key db_hold_commit, per "`COMMIT` of a transaction that changed rows, from a component process", by BothWiresKill, confirm Seen,
        what "a `COMMIT` is an occurrence only when the server's tags show its transaction changed rows (an empty or read-only one is passed on). The fault proxy holds the `COMMIT` (a simple query `COMMIT` or `END`) for up to 6 s, longer than the 5 s auto-commit interval of librdkafka and the Java client, and watches the process's Kafka wire. If an `OffsetCommit` is answered while the transaction is open, before the `COMMIT` or during the hold, the harness `SIGKILL`s the process and the `COMMIT` never reaches the server: the offsets are ahead of a transaction that rolls back. A consumer that commits its offsets only after its database commit is never killed by it; the hold ends and the `COMMIT` goes on",
        confirmed by "the process seen ending by SIGKILL, or the hold seen ending with the offsets unmoved";
    /// The email provider sends the email, then drops the connection with
    /// no response: the ambiguous outcome, which only an idempotency key
    /// makes safe to retry.
    ProviderResponseLost = "provider.response_lost", key provider_response_lost, per "email request that would send", by Provider, confirm Seen,
        what "the email provider that `chaos` runs sends the email, records it, and closes the connection without a byte of response: the caller cannot know whether it went out. A caller that retries with the same idempotency key gets the original answer and nothing is sent again; one without a key sends it twice",
        confirmed by "the retry that follows: a later request with the same key (or, without a key, the same body)";
    /// The email provider answers 503 before sending.
    ProviderError = "provider.error", key provider_error, per "email request that would send", by Provider, confirm Seen,
        what "the email provider answers `503` and sends nothing; the key is not kept, so a retry with it sends once. A caller that takes the 503 for success loses the email",
        confirmed by "the retry that follows: a later request with the same key (or, without a key, the same body)";
    /// The email provider sends, then holds its answer past the client's
    /// timeout.
    ProviderSlow = "provider.slow", key provider_slow, per "email request that would send", by Provider, confirm Seen,
        what "the email provider sends the email, records it, and holds the answer for 3 s, past the reference notifier's 1 s timeout: a timeout that is no proof the email did not go out",
        confirmed by "the hold ending, or the caller hanging up during it";
    /// The broker's process is stopped (SIGSTOP) for the timeline entry's
    /// `for`, then continued: every client's requests hang, then resume.
    BrokerPause = "broker.pause", key broker_pause, per "scheduled occurrence ([[nemesis.timeline]])", by Broker + schedulable, confirm Seen,
        what "`SIGSTOP` to the broker's process (found by the port it listens on, through `/proc`), `SIGCONT` after the entry's `for`: every client's requests hang, then resume. On the mock cluster: every request's round trip set to the entry's `for`, then back to none",
        confirmed by "the broker's process seen stopped by the kernel (the mock cluster: its round trip set and reset)";
    /// The broker's process is killed (SIGKILL) and, after the entry's
    /// `for`, started again by `[nemesis] broker_restart`.
    BrokerKill = "broker.kill", key broker_kill, per "scheduled occurrence ([[nemesis.timeline]])", by Broker + schedulable, confirm Seen,
        what "`SIGKILL` to the broker's process; after the entry's `for`, `[nemesis] broker_restart` (default `scripts/services.sh up kafka`) starts it again, keeping its topics. On the mock cluster: its broker down for the entry's `for`, then up",
        confirmed by "the broker seen gone, then listening again (the mock cluster: taken down and up)";
    /// The broker that leads partition 0 of the run's topic is killed
    /// (SIGKILL) and, after the entry's `for`, started again by `[nemesis]
    /// broker_restart`: on a cluster, another replica takes the partition.
    BrokerKillLeader = "broker.kill_leader", key broker_kill_leader, per "scheduled occurrence ([[nemesis.timeline]])", by Broker + schedulable, confirm Seen,
        what "the harness reads the metadata for the broker that leads partition 0 of the run's topic, `SIGKILL`s it (found by its port), waits for another broker to lead the partition, and after the entry's `for` runs `[nemesis] broker_restart` (for the cluster: `[\"scripts/services.sh\", \"up\", \"cluster\"]`, which starts the dead node again)",
        confirmed by "the leader seen gone, another broker leading the partition, then the killed one listening again";
    /// PostgreSQL restarts in immediate mode (`[nemesis] database_restart`):
    /// every session dies, the server recovers from its WAL.
    DbRestart = "db.restart", key db_restart, per "scheduled occurrence ([[nemesis.timeline]])", by Database + schedulable, confirm Seen,
        what "`[nemesis] database_restart` (default `scripts/services.sh restart-immediate postgres`: `pg_ctl restart -m immediate`): every session dies, the server recovers from its WAL",
        confirmed by "the postmaster's start time moved";
    /// Every database session of the run's components is terminated
    /// (`pg_terminate_backend`): open transactions roll back.
    DbTerminateBackends = "db.terminate_backends", key db_terminate_backends, per "scheduled occurrence ([[nemesis.timeline]])", by Database + schedulable, confirm Seen,
        what "`pg_terminate_backend` on every session of the run's components (named `chaos-<run id>-<component>`, in process or as processes; the harness's own sessions are spared); open transactions roll back. An occurrence waits up to 5 s for a component session to be open",
        confirmed by "at least one session of the run terminated";
}

impl FaultPoint {
    /// The point called `name` (e.g. `relay.after_produce`).
    pub fn from_name(name: &str) -> Option<FaultPoint> {
        FaultPoint::ALL.iter().copied().find(|p| p.name() == name)
    }

    /// The point called `name`, or a message that lists the names: what a
    /// flag's value or a schedule's entry is checked with.
    /// Either spelling: the name (`relay.after_produce`) or the scenario
    /// key (`relay_after_produce`), so that a name copied from a report or
    /// from a scenario file works in both places.
    pub fn named(name: &str) -> Result<FaultPoint, String> {
        let name = name.trim();
        Self::from_name(name).or_else(|| FaultPoint::ALL.iter().copied().find(|p| p.key() == name)).ok_or_else(|| {
            let names: Vec<&str> = FaultPoint::ALL.iter().map(|p| p.name()).collect();
            format!("{:?} is not a fault point; expected one of {}", name.trim(), names.join(", "))
        })
    }

    /// Whether firing at every occurrence stops all progress: the work it
    /// interrupts is tried again and meets the point again, so a run at
    /// probability 1 never ends.
    pub fn repeats_work(self) -> bool {
        use FaultPoint::*;
        matches!(
            self,
            RelayAfterProduce
                | RelayBeforeProduce
                | RelayProduceError
                | NotifierBeforeOffsetCommit
                | NotifierMidBatch
                | NotifierAfterExternalCall
                | StoreCommitRefused
                | ProviderError
                | ProviderResponseLost
                | ProviderSlow
        )
    }

    /// Applied to a process from outside, whatever the program: it needs a
    /// component that runs as one.
    pub fn needs_process(self) -> bool {
        matches!(self.strike(), Strike::Process | Strike::DbWireKill | Strike::KafkaWireKill | Strike::BothWiresKill)
    }

    /// A service fault: only a `[[nemesis.timeline]]` entry strikes it.
    pub fn is_service(self) -> bool {
        matches!(self.strike(), Strike::Broker | Strike::Database)
    }

    /// Struck by the fault proxy: it needs PostgreSQL, whose wire the proxy
    /// sits on, and applies to any program, the user's included.
    pub fn proxied(self) -> bool {
        matches!(
            self.strike(),
            Strike::DbWire | Strike::DbWireKill | Strike::KafkaWire | Strike::KafkaWireKill | Strike::BothWiresKill
        )
    }

    /// An aimed kill: the fault proxy kills the process at a window of
    /// its protocol (a commit acknowledged, an offset commit answered, a
    /// fetch with records, a produce acknowledged, a COMMIT held). Its rate
    /// may be read per second of a process's life instead of per window
    /// (`[nemesis] aimed`, [`Aimed`]).
    pub fn aimed(self) -> bool {
        use FaultPoint::*;
        matches!(
            self,
            DbKillAfterCommit
                | DbHoldCommit
                | KafkaKillAfterOffsetCommit
                | KafkaKillAfterFetch
                | KafkaKillAfterProduceAck
        )
    }

    /// Struck by the proxy in front of Kafka as well.
    pub fn on_kafka_wire(self) -> bool {
        matches!(self.strike(), Strike::KafkaWire | Strike::KafkaWireKill | Strike::BothWiresKill)
    }
}

/// The fault point reference, as Markdown: one row per point, from the
/// registry alone. docs/fault-points.md is this text; a test keeps it so.
pub fn reference() -> String {
    let mut out = String::from(
        "# Fault points\n\n\
         Generated from the registry (`fault_points!` in `src/faults/mod.rs`); \
         a test fails when this file and the registry differ. Keys in `[faults]` are the \
         point names with `_` for `.`. A fault counts as *fired* when the injector decides it, \
         and as *confirmed* only when the harness sees its effect.\n\n\
         **Aimed kills** (`db.kill_after_commit`, `db.hold_commit`, `kafka.kill_after_offset_commit`, \
         `kafka.kill_after_fetch`, `kafka.kill_after_produce_ack`) strike a process at a window of its protocol. \
         Their rate is per second of a process's life: each second is a draw at the rate, a draw that fires \
         arms the process, and its next window of the point's kind (the table's *per*) is struck. A program that \
         commits once per message and one that commits per batch of ten then take about the same number of kills \
         from one scenario, where per window the first takes ten times as many. `[nemesis] aimed = \
         \"per-occurrence\"` reads the rate per window instead (the shipped scenarios sized that way say so); \
         a replay's `--schedule` names windows either way. Every other point keeps its rate per occurrence: a \
         fault on each batch, each produce, each email is the point.\n\n\
         | fault point | `[faults]` key | per | needs | timeline | what happens | confirmed by |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for p in FaultPoint::ALL {
        let timeline = match (p.is_service(), p.schedulable()) {
            (true, _) => "only",
            (false, true) => "also",
            _ => "no",
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} | {} | {} |\n",
            p.name(),
            p.key(),
            p.unit(),
            p.strike().needs(),
            timeline,
            p.what(),
            p.confirmed_by()
        ));
    }
    out
}

/// Who strikes a fault point. It decides what a run needs for the point,
/// and which reference component (if any) has it in its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strike {
    /// The reference relay, in its own code.
    Relay,
    /// The reference notifier, in its own code.
    Notifier,
    /// The reference payment service, in its own code.
    Workload,
    /// The store adapter, at any reference component's commit.
    Store,
    /// The harness, on a component process from outside (signals).
    Process,
    /// The fault proxy on a component's PostgreSQL wire.
    DbWire,
    /// The fault proxy on the PostgreSQL wire, then a SIGKILL to the
    /// component's process.
    DbWireKill,
    /// The fault proxy on a component's Kafka wire.
    KafkaWire,
    /// The fault proxy on the Kafka wire, then a SIGKILL to the process.
    KafkaWireKill,
    /// The fault proxy on both wires of a process: what it sees on one
    /// decides a SIGKILL on the other.
    BothWiresKill,
    /// The email provider that `chaos` runs, at a request.
    Provider,
    /// The nemesis timeline, on the broker.
    Broker,
    /// The nemesis timeline, on PostgreSQL.
    Database,
}

impl Strike {
    /// The reference component whose code holds the strike: `relay`,
    /// `notifier` or `workload`; None for a fault from outside.
    pub fn component(self) -> Option<&'static str> {
        match self {
            Strike::Relay => Some("relay"),
            Strike::Notifier => Some("notifier"),
            Strike::Workload => Some("workload"),
            _ => None,
        }
    }

    /// What a run needs for it, for people.
    pub fn needs(self) -> &'static str {
        match self {
            Strike::Relay => "the reference relay",
            Strike::Notifier => "the reference notifier",
            Strike::Workload => "the reference payment service",
            Strike::Store => "a reference component (the payment service always is); either backend",
            Strike::Process => "a component that runs as a process",
            Strike::DbWire => "PostgreSQL (the fault proxy)",
            Strike::DbWireKill => "PostgreSQL (the fault proxy) and a component that runs as a process",
            Strike::KafkaWire => "PostgreSQL and a real Kafka broker with the slot listeners (the fault proxy)",
            Strike::KafkaWireKill => "the same as `kafka.produce_ack_lost`, and a component that runs as a process",
            Strike::BothWiresKill => "the same as `kafka.produce_ack_lost`, and a consumer that runs as a process",
            Strike::Provider => "a notifier that sends emails (`notifier.email`, on by default for the reference notifier); either backend",
            Strike::Broker => "a Kafka broker process on this machine, or the mock cluster; a timeline entry",
            Strike::Database => "PostgreSQL; a timeline entry",
        }
    }
}

/// Which effect confirms a fault point's firing. In process, the strike
/// site confirms it; when the component runs as a process and stops at
/// the point for the harness's SIGKILL, the keeper confirms it from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// The component's next incarnation starting.
    NextIncarnation,
    /// Copies on the topic, which the verifier counts.
    TopicCopies,
    /// The batch's first message delivered again; as a process, the
    /// process seen ending by SIGKILL holding its batch.
    Redelivery,
    /// What the harness, the proxy or the verifier saw of the act itself.
    Seen,
}

choices! {
    /// What an aimed kill's rate counts (`[nemesis] aimed`).
    ///
    /// Per window, a program that commits once per message meets ten times
    /// as many windows as one that commits per batch of ten, and so takes ten
    /// times the kills from the same scenario: a rate sized for one is a kill
    /// storm for the other. Per second, each process is armed at the rate
    /// once a second of its life, and an armed process is struck at its next
    /// window of the point's kind: the same scenario takes about the same
    /// number of kills from either program, and every kill still lands in
    /// the window it aims at.
    Aimed {
        /// Each window is an occurrence, decided at the rate.
        PerOccurrence = "per-occurrence",
        /// Each second of a process's life is a draw at the rate; a draw
        /// that fires arms the process, and its next window is struck.
        PerSecond = "per-second",
    }
}

/// How many fault points there are.
pub const N: usize = FaultPoint::ALL.len();

/// A probability per fault point, indexed by point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FaultRates(#[serde(with = "rates")] [f64; N]);

/// The rates as a sequence: serde's arrays stop at 32 elements, and the
/// registry has more points than that.
mod rates {
    use super::N;
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[f64; N], s: S) -> Result<S::Ok, S::Error> {
        v.as_slice().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[f64; N], D::Error> {
        let v = Vec::<f64>::deserialize(d)?;
        let n = v.len();
        v.try_into().map_err(|_| D::Error::invalid_length(n, &"one rate per fault point"))
    }
}

impl FaultRates {
    /// No faults at all.
    pub fn none() -> Self {
        Self([0.0; N])
    }

    pub fn get(&self, point: FaultPoint) -> f64 {
        self.0[point.index()]
    }

    /// The same rates with `point` at `p`.
    pub fn with(mut self, point: FaultPoint, p: f64) -> Self {
        self.0[point.index()] = p;
        self
    }
}

impl FaultPoint {
    fn index(self) -> usize {
        self as usize
    }

    /// A stable per-point salt, so points do not share a decision stream.
    fn salt(self) -> u64 {
        self.name().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    }
}

/// The decision for one occurrence: a pure function, usable by tests and by
/// anyone who wants to know in advance what a seed will do.
pub fn decide(seed: u64, point: FaultPoint, occurrence: u64, probability: f64) -> bool {
    if probability <= 0.0 {
        return false;
    }
    let mixed = splitmix(seed ^ point.salt()).wrapping_add(occurrence.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut rng = rand::rngs::StdRng::seed_from_u64(splitmix(mixed));
    rng.gen::<f64>() < probability
}

/// Mixed into the seed for the arming draws of [`Aimed::PerSecond`].
const ARMING_SALT: u64 = 0x6172_6d69_6e67_0001;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One fault that fired.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRecord {
    pub point: String,
    pub component: String,
    /// Milliseconds since the run started.
    pub at_ms: u64,
    /// What it hit, e.g. "batch of 12 events (first seq 340)".
    pub hit: String,
    /// Which occurrence of its point it was, counted from 0 across the
    /// run: what a [`Schedule`] names. None for a firing a component
    /// process reported, whose occurrences count in that process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurrence: Option<u64>,
    /// Which data it hit, when the component that struck it knows: what
    /// matches an anomaly's example to its cause
    /// ([`crate::verifier::attribution`]).
    #[serde(default, skip_serializing_if = "Reach::is_empty")]
    pub reach: Reach,
}

/// The data a firing hit: the outbox rows of a relay's batch, the topic
/// positions of a notifier's batch. Empty when the striker cannot know
/// (a proxy, a signal to a process).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reach {
    /// The outbox seqs of the batch, as runs of consecutive seqs (first,
    /// last): a relay's claim skips rows other relays hold, so its batch
    /// need not be one range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seqs: Vec<(i64, i64)>,
    /// The topic positions of the batch: per partition, its first and
    /// last offset (a consumer reads a partition in order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<(i32, i64, i64)>,
}

impl Reach {
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty() && self.spans.is_empty()
    }

    /// A batch of outbox rows, by their seqs in any order.
    pub fn outbox(seqs: impl IntoIterator<Item = i64>) -> Reach {
        let mut all: Vec<i64> = seqs.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        let mut runs: Vec<(i64, i64)> = Vec::new();
        for s in all {
            match runs.last_mut() {
                Some(r) if r.1 + 1 == s => r.1 = s,
                _ => runs.push((s, s)),
            }
        }
        Reach { seqs: runs, spans: vec![] }
    }

    /// A batch of messages, by their (partition, offset).
    pub fn topic(messages: impl IntoIterator<Item = (i32, i64)>) -> Reach {
        Reach { seqs: vec![], spans: spans_of(messages).0 }
    }

    /// The run holding outbox seq `seq`, if any.
    pub fn seq_run(&self, seq: i64) -> Option<(i64, i64)> {
        self.seqs.iter().copied().find(|(a, b)| (*a..=*b).contains(&seq))
    }

    /// The span holding the message at `partition`:`offset`, if any.
    pub fn span_of(&self, partition: i32, offset: i64) -> Option<(i32, i64, i64)> {
        self.spans.iter().copied().find(|(p, a, b)| *p == partition && (*a..=*b).contains(&offset))
    }
}

/// Messages as (partition, offset) folded into per-partition spans (first,
/// last offset), with their count.
fn spans_of(messages: impl IntoIterator<Item = (i32, i64)>) -> (Vec<(i32, i64, i64)>, u32) {
    let mut spans: Vec<(i32, i64, i64)> = Vec::new();
    let mut n = 0u32;
    for (p, o) in messages {
        n += 1;
        match spans.iter_mut().find(|s| s.0 == p) {
            Some(s) => {
                s.1 = s.1.min(o);
                s.2 = s.2.max(o);
            }
            None => spans.push((p, o, o)),
        }
    }
    (spans, n)
}

/// Fault firings pinned by occurrence, in place of the seeded decisions
/// (`chaos run --schedule`, and what `chaos sweep --shrink` shrinks): a
/// point fires at exactly the occurrences listed for it, and a point not
/// listed never fires. Occurrences count each time any component reaches
/// the point, from 0, so a schedule replays the same firings as far as the
/// threads reach the points in the same order.
///
/// In JSON it is the text `--schedule` reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Schedule(pub std::collections::BTreeMap<FaultPoint, std::collections::BTreeSet<u64>>);

impl From<Schedule> for String {
    fn from(s: Schedule) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for Schedule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Schedule::parse(&s)
    }
}

impl Schedule {
    /// Every (point, occurrence), in point then occurrence order.
    pub fn firings(&self) -> Vec<(FaultPoint, u64)> {
        self.0.iter().flat_map(|(p, ns)| ns.iter().map(move |n| (*p, *n))).collect()
    }

    pub fn from_firings(firings: impl IntoIterator<Item = (FaultPoint, u64)>) -> Self {
        let mut s = Schedule::default();
        for (p, n) in firings {
            s.0.entry(p).or_default().insert(n);
        }
        s
    }

    pub fn len(&self) -> usize {
        self.0.values().map(|ns| ns.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn fires(&self, point: FaultPoint, occurrence: u64) -> bool {
        self.0.get(&point).is_some_and(|ns| ns.contains(&occurrence))
    }

    /// Parses `relay.after_produce:3,17;notifier.mid_batch:2`, or `none`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut s = Schedule::default();
        let text = text.trim();
        if text == "none" {
            return Ok(s);
        }
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, list) = part.split_once(':').ok_or_else(|| {
                format!("{part:?} has no occurrences; write POINT:N[,N...], e.g. relay.after_produce:3,17")
            })?;
            let point = FaultPoint::named(name)?;
            if point.is_service() {
                return Err(format!(
                    "{} strikes only on the scenario's [[nemesis.timeline]]; a schedule pins the other points",
                    point.name()
                ));
            }
            for n in list.split(',').map(str::trim) {
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("{n:?} in {part:?} is not an occurrence; occurrences are integers from 0"))?;
                s.0.entry(point).or_default().insert(n);
            }
        }
        if s.is_empty() {
            return Err("the schedule is empty; write POINT:N[,N...] separated by ';', or none".into());
        }
        Ok(s)
    }
}

impl std::fmt::Display for Schedule {
    /// The form [`Schedule::parse`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|(_, ns)| !ns.is_empty())
            .map(|(p, ns)| format!("{}:{}", p.name(), ns.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")))
            .collect();
        f.write_str(&parts.join(";"))
    }
}

/// One batch a reference notifier received: what puts each delivery of a
/// message on an anomaly's story ([`crate::verifier::story`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    pub component: String,
    /// Milliseconds since the run started.
    pub at_ms: u64,
    pub messages: u32,
    /// Per partition, the first and last offset the batch held (a
    /// consumer reads a partition in order, so the batch holds the range).
    pub spans: Vec<(i32, i64, i64)>,
}

impl DeliveryRecord {
    pub fn covers(&self, partition: i32, offset: i64) -> bool {
        self.spans.iter().any(|(p, a, b)| *p == partition && (*a..=*b).contains(&offset))
    }
}

/// Per-point totals for the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultSummary {
    pub point: String,
    pub unit: String,
    pub probability: f64,
    pub occurrences: u64,
    pub fired: u64,
    /// Firings whose effect the harness saw ([`FaultPoint::confirmed_by`]).
    #[serde(default)]
    pub confirmed: u64,
    /// Firings whose effect another fault pre-empted (the process killed
    /// by another point during a hold): neither confirmed nor missed.
    #[serde(default)]
    pub preempted: u64,
    /// Why each pre-empted firing had no effect of its own (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempted_why: Vec<String>,
    /// With `[nemesis] aimed = "per-second"`, an aimed kill's seconds of
    /// process life drawn, and the draws that armed a process: `probability`
    /// is then per second, `occurrences` counts the windows met and `fired`
    /// the armed ones struck. None for any other point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed: Option<(u64, u64)>,
}

/// A watched message: who holds it, when it was last delivered, and the
/// firings waiting for it to be delivered again.
#[derive(Debug, Default)]
struct Watch {
    holders: u32,
    last_delivery: u64,
    awaiting: Vec<(FaultPoint, u64)>,
}

/// A batch a notifier received, for [`FaultInjector::settled`] and
/// [`FaultInjector::await_redelivery`]: its first message and when it came.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub first: (i32, i64),
    delivery: u64,
}

/// What the harness still has to see before a firing counts as confirmed.
#[derive(Debug, Default)]
struct Awaited {
    /// The first message of each batch a notifier holds or a fault waits
    /// on, by (partition, offset).
    watched: std::collections::HashMap<(i32, i64), Watch>,
    /// Numbers the deliveries, so "delivered again after I received it" is
    /// a comparison.
    deliveries: u64,
    /// Relay faults the verifier confirms from the topic: the point, the
    /// batch's first event and the copies of it the topic must hold.
    copies: Vec<(FaultPoint, uuid::Uuid, u8)>,
}

/// Shared by every component of a run.
pub struct FaultInjector {
    seed: u64,
    rates: [f64; N],
    occurrences: [AtomicU64; N],
    fired: [AtomicU64; N],
    confirmed: [AtomicU64; N],
    /// Firings another fault pre-empted, each with its point and why.
    preempted: Mutex<Vec<(FaultPoint, String)>>,
    awaited: Mutex<Awaited>,
    log: Mutex<Vec<FaultRecord>>,
    /// Pinned firings, in place of the seeded decisions.
    schedule: Option<Schedule>,
    /// What an aimed kill's rate counts.
    aimed: Aimed,
    /// Per point, the seconds of process life drawn for arming so far: the
    /// occurrence numbers of the arming decisions.
    draws: [AtomicU64; N],
    /// Per point, the draws that armed a process.
    armings: [AtomicU64; N],
    /// The (point, component) pairs armed and not yet struck.
    arms: Mutex<Vec<(FaultPoint, String)>>,
    /// The consumers' group is rebalancing, as the coordinator last said
    /// ([`FaultInjector::set_group_stable`]).
    rebalancing: std::sync::atomic::AtomicBool,

    /// Every in-process firing by occurrence, uncapped: the schedule a
    /// shrink starts from.
    fired_at: Mutex<Vec<(FaultPoint, u64)>>,
    /// The batches the reference notifiers received (in process, or
    /// reported by their processes), the first [`DELIVERY_LOG_CAP`] of them.
    deliveries: Mutex<Vec<DeliveryRecord>>,
    started: Instant,
    /// The same moment on the wall clock, which the database's timestamps
    /// share: what dates an anomaly against the fault log.
    started_wall: std::time::SystemTime,
    /// Inside a `chaos component` process: the line to the harness, which
    /// keeps the run's counts and ends the process at a crash point.
    link: std::sync::OnceLock<std::sync::Arc<dyn HarnessLink>>,
}

/// What a component process tells the harness, and how it asks to be
/// stopped. The injector holds one only inside a `chaos component`
/// process (the harness's side of the protocol implements it); in process
/// it holds none and keeps every count itself.
pub trait HarnessLink: Send + Sync {
    /// A fault fired here.
    fn fired(&self, record: &FaultRecord);
    /// `n` firings of `point` had their effect.
    fn confirmed(&self, point: FaultPoint, n: u64);
    /// A firing of `point` waits for `copies` copies of `event` on the topic.
    fn copies(&self, point: FaultPoint, event: uuid::Uuid, copies: u8);
    /// A notifier received a batch: its size and its (partition, first,
    /// last offset) spans.
    fn delivered(&self, component: &str, messages: u32, spans: Vec<(i32, i64, i64)>);
    /// A firing of `point` waits for the next delivery of `first`, to any
    /// process of the run.
    fn awaits_delivery(&self, point: FaultPoint, first: (i32, i64));
    /// Stopped at a crash point for `fires` firings: send the last figures
    /// and ask to be killed.
    fn halt(&self, injector: &FaultInjector, point: FaultPoint, fires: u64);
    /// At a stall point: ask to be stopped for `d`.
    fn stall(&self, point: FaultPoint, d: Duration);
}

/// How long a stalled component process waits for the harness's SIGSTOP
/// to land before it goes on (it goes on, late, once SIGCONT comes).
const STALL_HANDOFF: Duration = Duration::from_millis(100);

/// The log keeps the first records only; the counters count them all.
const LOG_CAP: usize = 10_000;

/// Batches kept for the stories: a few megabytes at most (a run of a
/// million payments takes about 40,000 batches, redeliveries included).
pub const DELIVERY_LOG_CAP: usize = 200_000;

impl FaultInjector {
    pub fn new(seed: u64, rates: &FaultRates) -> Self {
        Self {
            seed,
            rates: std::array::from_fn(|i| rates.get(FaultPoint::ALL[i])),
            occurrences: std::array::from_fn(|_| AtomicU64::new(0)),
            fired: std::array::from_fn(|_| AtomicU64::new(0)),
            confirmed: std::array::from_fn(|_| AtomicU64::new(0)),
            preempted: Mutex::new(Vec::new()),
            awaited: Mutex::new(Awaited::default()),
            log: Mutex::new(Vec::new()),
            schedule: None,
            aimed: Aimed::PerOccurrence,
            draws: std::array::from_fn(|_| AtomicU64::new(0)),
            armings: std::array::from_fn(|_| AtomicU64::new(0)),
            arms: Mutex::new(Vec::new()),
            rebalancing: Default::default(),
            fired_at: Mutex::new(Vec::new()),
            deliveries: Mutex::new(Vec::new()),
            started: Instant::now(),
            started_wall: std::time::SystemTime::now(),
            link: std::sync::OnceLock::new(),
        }
    }

    /// Makes this injector a component process's: from now on it reports
    /// to the harness through `link`. Set once; a second link is ignored.
    pub fn link_to_harness(&self, link: std::sync::Arc<dyn HarnessLink>) {
        let _ = self.link.set(link);
    }

    fn link(&self) -> Option<&dyn HarnessLink> {
        self.link.get().map(|l| l.as_ref())
    }

    /// True inside a `chaos component` process, whose harness keeps the
    /// run's counts and ends it at a crash point.
    pub fn linked(&self) -> bool {
        self.link.get().is_some()
    }

    /// At a crash point: in a component process, say so and stop here until
    /// the harness's SIGKILL; in process, return at once (the caller
    /// crashes in place).
    pub async fn halt(&self, point: FaultPoint) {
        self.halt_for(point, 1).await
    }

    /// [`FaultInjector::halt`] for a crash that `fires` firings of `point` decided.
    pub async fn halt_for(&self, point: FaultPoint, fires: u64) {
        if let Some(link) = self.link() {
            link.halt(self, point, fires);
            std::future::pending::<()>().await;
        }
    }

    /// At a stall point: in a component process, ask the harness to stop
    /// this process for `d` and return true once it runs again; in
    /// process, return false (the caller stalls in place).
    pub async fn stall(&self, point: FaultPoint, d: Duration) -> bool {
        let Some(link) = self.link() else { return false };
        link.stall(point, d);
        tokio::time::sleep(STALL_HANDOFF).await;
        true
    }

    /// The same injector with its decisions pinned to `schedule`.
    /// A point the schedule leaves out counts as off (probability 0), so
    /// the chaos checks ask only the listed points to fire; the timeline's
    /// service faults are the timeline's.
    pub fn with_schedule(mut self, schedule: Option<Schedule>) -> Self {
        if let Some(s) = &schedule {
            for p in FaultPoint::ALL.iter().filter(|p| !p.is_service()) {
                if s.0.get(p).is_none_or(|ns| ns.is_empty()) {
                    self.rates[p.index()] = 0.0;
                }
            }
        }
        self.schedule = schedule;
        self
    }

    /// The same injector with aimed kills' rates read as `aimed` says.
    pub fn with_aimed(mut self, aimed: Aimed) -> Self {
        self.aimed = aimed;
        self
    }

    /// Whether `point` fires only at a window of a process armed before
    /// ([`Aimed::PerSecond`]). A schedule pins windows by occurrence
    /// instead, so that a replay strikes the same ones.
    pub fn arms(&self, point: FaultPoint) -> bool {
        self.aimed == Aimed::PerSecond && point.aimed() && self.schedule.is_none() && self.rates[point.index()] > 0.0
    }

    /// One second of `component`'s process life, for `point`: a seeded
    /// draw at the point's rate, which when it fires arms the process for
    /// its next window. An armed process stays armed (once) until struck.
    /// Returns whether this draw armed it.
    pub fn arm(&self, point: FaultPoint, component: &str) -> bool {
        if !self.arms(point) {
            return false;
        }
        let i = point.index();
        let n = self.draws[i].fetch_add(1, Ordering::Relaxed);
        // Its own decision stream: the windows' stream stays the one a
        // per-occurrence run of the same seed draws.
        if !decide(self.seed ^ ARMING_SALT, point, n, self.rates[i]) {
            return false;
        }
        self.armings[i].fetch_add(1, Ordering::Relaxed);
        let mut arms = self.arms.lock().unwrap_or_else(|p| p.into_inner());
        if !arms.iter().any(|(p, c)| *p == point && c == component) {
            arms.push((point, component.to_string()));
        }
        true
    }

    /// What the coordinator last said of the consumers' group: stable or
    /// not. Unknown (a broker that cannot say) is stable.
    pub fn set_group_stable(&self, stable: bool) {
        self.rebalancing.store(!stable, Ordering::Relaxed);
    }

    /// Whether a second of `component`'s life must pass undrawn because it
    /// is a consumer (a notifier slot, the reference's or a program's) and
    /// its group is rebalancing. A kill then teaches nothing a kill after
    /// the rebalance would not, and a client without static membership
    /// killed while its group rebalances makes the group rebalance again,
    /// and again: a kill storm that never drains. The caller counts it
    /// (`Stats::group_waits`).
    pub fn waits_for_group(&self, component: &str) -> bool {
        component.starts_with("notifier") && self.rebalancing.load(Ordering::Relaxed)
    }

    /// Takes `component`'s arm for `point`: true when it was armed.
    fn disarm(&self, point: FaultPoint, component: &str) -> bool {
        let mut arms = self.arms.lock().unwrap_or_else(|p| p.into_inner());
        match arms.iter().position(|(p, c)| *p == point && c == component) {
            Some(i) => {
                arms.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Per point, the seconds drawn and the draws that armed a process.
    pub fn armed(&self, point: FaultPoint) -> (u64, u64) {
        let i = point.index();
        (self.draws[i].load(Ordering::Relaxed), self.armings[i].load(Ordering::Relaxed))
    }

    /// When the log's clock started, in milliseconds since the epoch.
    pub fn started_epoch_ms(&self) -> i64 {
        self.started_wall.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    pub fn probability(&self, point: FaultPoint) -> f64 {
        self.rates[point.index()]
    }

    /// Reaches a fault point once. Returns true when the fault fires; then it
    /// is counted and logged with what it hit.
    pub fn strike(&self, point: FaultPoint, component: &str, hit: impl FnOnce() -> String) -> bool {
        self.strike_reaching(point, component, hit, Reach::default)
    }

    /// [`FaultInjector::strike`], logging the data the firing hit too: a
    /// relay's batch of outbox rows, a notifier's batch of messages.
    pub fn strike_reaching(
        &self,
        point: FaultPoint,
        component: &str,
        hit: impl FnOnce() -> String,
        reach: impl FnOnce() -> Reach,
    ) -> bool {
        let i = point.index();
        let n = self.occurrences[i].fetch_add(1, Ordering::Relaxed);
        let fires = match &self.schedule {
            Some(s) => self.rates[i] > 0.0 && s.fires(point, n),
            // Every window is an occurrence (what a schedule pins); only
            // an armed process's is struck.
            None if self.arms(point) => self.disarm(point, component),
            None => decide(self.seed, point, n, self.rates[i]),
        };
        if !fires {
            return false;
        }
        self.fired[i].fetch_add(1, Ordering::Relaxed);
        self.fired_at.lock().unwrap_or_else(|p| p.into_inner()).push((point, n));
        let record = FaultRecord {
            point: point.name().to_string(),
            component: component.to_string(),
            at_ms: self.started.elapsed().as_millis() as u64,
            hit: hit(),
            occurrence: Some(n),
            reach: reach(),
        };
        tracing::info!(point = %record.point, component = %record.component, hit = %record.hit, "fault fired");
        // A component process tells the harness, which keeps the run's count.
        if let Some(link) = self.link() {
            link.fired(&record);
        }
        self.push_log(record);
        true
    }

    fn push_log(&self, record: FaultRecord) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() < LOG_CAP {
            log.push(record);
        }
    }

    /// A firing a component process reported: counted and logged here, at
    /// the harness's clock.
    pub fn record_fired(&self, point: FaultPoint, mut record: FaultRecord) {
        self.fired[point.index()].fetch_add(1, Ordering::Relaxed);
        record.at_ms = self.started.elapsed().as_millis() as u64;
        record.occurrence = None;
        self.push_log(record);
    }

    /// How often a point was reached.
    pub fn reached(&self, point: FaultPoint) -> u64 {
        self.occurrences[point.index()].load(Ordering::Relaxed)
    }

    /// Occurrences a component process reported.
    pub fn add_reached(&self, point: FaultPoint, n: u64) {
        self.occurrences[point.index()].fetch_add(n, Ordering::Relaxed);
    }

    /// `n` firings of `point` had the effect the harness looks for.
    pub fn confirm(&self, point: FaultPoint, n: u64) {
        if let Some(link) = self.link() {
            link.confirmed(point, n);
        }
        self.confirmed[point.index()].fetch_add(n, Ordering::Relaxed);
    }

    pub fn confirmed(&self, point: FaultPoint) -> u64 {
        self.confirmed[point.index()].load(Ordering::Relaxed)
    }

    /// A firing of `point` on `component` had no effect of its own: another
    /// fault ended the process first (`why`). Counted apart, so a correct
    /// run is not inconclusive for it, and said in the report.
    pub fn preempt(&self, point: FaultPoint, component: &str, why: &str) {
        tracing::info!(point = point.name(), component, why, "a firing was pre-empted by another fault");
        let at = self.started.elapsed().as_millis();
        self.preempted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((point, format!("{component} at {at} ms: {why}")));
    }

    pub fn preempted(&self, point: FaultPoint) -> u64 {
        self.preempted.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|(p, _)| *p == point).count() as u64
    }

    fn awaited(&self) -> std::sync::MutexGuard<'_, Awaited> {
        self.awaited.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A notifier received a batch. Confirms the firings waiting for any of
    /// its messages to come again, and watches the batch's first message
    /// until the batch is settled or crashes. Watching from receipt, not
    /// from the crash, matters: during a rebalance two consumers may read the
    /// same messages, and the redelivery can come before the crash is known.
    pub fn delivered(&self, first: (i32, i64), messages: impl IntoIterator<Item = (i32, i64)>) -> Held {
        let mut a = self.awaited();
        a.deliveries += 1;
        let now = a.deliveries;
        for m in messages {
            if let Some(w) = a.watched.get_mut(&m) {
                w.last_delivery = now;
                for (point, fires) in std::mem::take(&mut w.awaiting) {
                    self.confirm(point, fires);
                }
            }
        }
        let w = a.watched.entry(first).or_default();
        w.holders += 1;
        w.last_delivery = now;
        Held { first, delivery: now }
    }

    /// Logs a batch `component` received (its messages as (partition,
    /// offset)), for the anomalies' stories.
    pub fn log_delivery(&self, component: &str, messages: impl IntoIterator<Item = (i32, i64)>) {
        let (spans, n) = spans_of(messages);
        if let Some(link) = self.link() {
            // A component process tells the harness, whose log the stories read.
            link.delivered(component, n, spans);
            return;
        }
        self.record_delivery(component.to_string(), n, spans);
    }

    /// A batch received, logged at the harness's clock (a component
    /// process's report comes here).
    pub fn record_delivery(&self, component: String, messages: u32, spans: Vec<(i32, i64, i64)>) {
        {
            // What a process reported confirms the firings awaiting a
            // delivery of a message in its spans (in process,
            // [`FaultInjector::delivered`] took them already).
            let mut a = self.awaited();
            let covered = |k: &(i32, i64)| spans.iter().any(|s| s.0 == k.0 && s.1 <= k.1 && k.1 <= s.2);
            let hit: Vec<(i32, i64)> =
                a.watched.iter().filter(|(k, w)| !w.awaiting.is_empty() && covered(k)).map(|(k, _)| *k).collect();
            for k in hit {
                if let Some(w) = a.watched.get_mut(&k) {
                    for (point, fires) in std::mem::take(&mut w.awaiting) {
                        self.confirm(point, fires);
                    }
                }
            }
        }
        let at_ms = self.started.elapsed().as_millis() as u64;
        let mut log = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() < DELIVERY_LOG_CAP {
            log.push(DeliveryRecord { component, at_ms, messages, spans });
        }
    }

    /// The batches the reference notifiers received, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.deliveries.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The batch is done (committed, or failed without a fault): stop
    /// watching it.
    pub fn settled(&self, held: Held) {
        let mut a = self.awaited();
        Self::release(&mut a, held.first);
    }

    fn release(a: &mut Awaited, first: (i32, i64)) {
        if let Some(w) = a.watched.get_mut(&first) {
            w.holders = w.holders.saturating_sub(1);
            if w.holders == 0 && w.awaiting.is_empty() {
                a.watched.remove(&first);
            }
        }
    }

    /// `fires` firings of `point` hit the held batch: they are confirmed by
    /// its first message delivered again after the batch was received (at
    /// once, if that has happened already), to any notifier.
    pub fn await_redelivery(&self, point: FaultPoint, fires: u64, held: Held) {
        let mut a = self.awaited();
        let w = a.watched.entry(held.first).or_default();
        if w.last_delivery > held.delivery {
            self.confirm(point, fires);
        } else {
            w.awaiting.push((point, fires));
        }
        Self::release(&mut a, held.first);
    }

    /// `point` fired on data already settled (a replay): confirmed by the
    /// next delivery of `first`.
    pub fn await_next_delivery(&self, point: FaultPoint, first: (i32, i64)) {
        if let Some(link) = self.link() {
            // The harness watches every process's deliveries; this process
            // may be killed before it reads the message again.
            link.awaits_delivery(point, first);
            return;
        }
        self.awaited().watched.entry(first).or_default().awaiting.push((point, 1));
    }

    /// A firing of `point` is confirmed when the topic holds at least `copies`
    /// copies of `event`; the verifier looks.
    pub fn await_copies(&self, point: FaultPoint, event: uuid::Uuid, copies: u8) {
        // The verifier of the harness looks for them, not a component process.
        if let Some(link) = self.link() {
            link.copies(point, event, copies);
        }
        self.awaited().copies.push((point, event, copies));
    }

    /// The copies the verifier must look for, taken once.
    pub fn take_awaited_copies(&self) -> Vec<(FaultPoint, uuid::Uuid, u8)> {
        std::mem::take(&mut self.awaited().copies)
    }

    pub fn fired(&self, point: FaultPoint) -> u64 {
        self.fired[point.index()].load(Ordering::Relaxed)
    }

    pub fn total_fired(&self) -> u64 {
        FaultPoint::ALL.iter().map(|p| self.fired(*p)).sum()
    }

    pub fn summary(&self) -> Vec<FaultSummary> {
        FaultPoint::ALL
            .iter()
            .map(|p| FaultSummary {
                point: p.name().to_string(),
                unit: match self.arms(*p) {
                    true => format!("second, per process (armed, then struck at its next {})", p.unit()),
                    false => p.unit().to_string(),
                },
                probability: self.probability(*p),
                occurrences: self.occurrences[p.index()].load(Ordering::Relaxed),
                fired: self.fired(*p),
                confirmed: self.confirmed(*p),
                preempted: self.preempted(*p),
                preempted_why: {
                    let all = self.preempted.lock().unwrap_or_else(|p| p.into_inner());
                    all.iter().filter(|(q, _)| q == p).take(5).map(|(_, why)| why.clone()).collect()
                },
                armed: self.arms(*p).then(|| self.armed(*p)),
            })
            .collect()
    }

    /// Every firing struck in this process, as a schedule that replays it.
    pub fn fired_schedule(&self) -> Schedule {
        Schedule::from_firings(self.fired_at.lock().unwrap_or_else(|p| p.into_inner()).iter().copied())
    }

    pub fn log(&self) -> Vec<FaultRecord> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The faults' side of the run's history, for the checkers: taken once
    /// the run is over (the firings that wait for copies on the topic are
    /// taken with it).
    pub fn history(&self) -> FaultHistory {
        FaultHistory {
            started_epoch_ms: self.started_epoch_ms(),
            log: self.log(),
            deliveries: self.deliveries(),
            awaited_copies: self.take_awaited_copies(),
        }
    }
}

/// What the run's faults left for the checkers to read: when the run
/// started, every firing with its reach, what the notifiers received, and
/// the firings confirmed only by copies of an event on the topic. The
/// checkers read this value, never the injector: what they find confirmed
/// they return, and the harness writes it into the injector.
#[derive(Debug, Clone, Default)]
pub struct FaultHistory {
    pub started_epoch_ms: i64,
    pub log: Vec<FaultRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    /// Each firing whose effect is `copies` copies of `event` on the topic.
    pub awaited_copies: Vec<(FaultPoint, uuid::Uuid, u8)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reach_keeps_a_batch_as_runs_of_seqs_and_spans_of_offsets() {
        let r = Reach::outbox([9, 5, 6, 7, 12, 13, 6]);
        assert_eq!(r.seqs, [(5, 7), (9, 9), (12, 13)]);
        assert_eq!((r.seq_run(6), r.seq_run(8), r.seq_run(13)), (Some((5, 7)), None, Some((12, 13))));
        let t = Reach::topic([(1, 20), (0, 3), (1, 18), (1, 19)]);
        assert_eq!(t.spans, [(1, 18, 20), (0, 3, 3)]);
        assert_eq!((t.span_of(1, 19), t.span_of(0, 4), t.span_of(2, 19)), (Some((1, 18, 20)), None, None));
        assert!(Reach::default().is_empty() && !t.is_empty());
    }

    /// Two processes over 200 seconds, one meeting 10 windows a second (a
    /// consumer that commits per message), the other 1 (per batch of ten):
    /// the kills each takes at one scenario's rate.
    fn kills_per_program(aimed: Aimed, rate: f64) -> (u64, u64) {
        let point = FaultPoint::DbKillAfterCommit;
        let f = FaultInjector::new(7, &FaultRates::none().with(point, rate)).with_aimed(aimed);
        let (mut per_message, mut per_batch) = (0, 0);
        for _second in 0..200 {
            if aimed == Aimed::PerSecond {
                f.arm(point, "notifier-1");
                f.arm(point, "notifier-2");
            }
            per_message += (0..10).filter(|_| f.strike(point, "notifier-1", String::new)).count() as u64;
            per_batch += f.strike(point, "notifier-2", String::new) as u64;
        }
        (per_message, per_batch)
    }

    #[test]
    fn per_second_an_aimed_kill_strikes_programs_alike_whatever_their_windows() {
        let (per_message, per_batch) = kills_per_program(Aimed::PerSecond, 0.1);
        // About 20 arms each (200 seconds at 0.1), each struck once.
        assert!((10..=32).contains(&per_message) && (10..=32).contains(&per_batch), "{per_message} {per_batch}");
        assert!(per_message.abs_diff(per_batch) <= 12, "{per_message} against {per_batch}");
        // Per occurrence, the same rate strikes the per-message program
        // about ten times as often: the kill storm this mode ends.
        let (per_message, per_batch) = kills_per_program(Aimed::PerOccurrence, 0.1);
        assert!(per_message > 5 * per_batch, "{per_message} against {per_batch}");
    }

    #[test]
    fn an_arm_is_taken_once_by_its_own_process_and_a_schedule_ignores_it() {
        let point = FaultPoint::KafkaKillAfterFetch;
        let rates = FaultRates::none().with(point, 1.0);
        let f = FaultInjector::new(1, &rates).with_aimed(Aimed::PerSecond);
        assert!(!f.strike(point, "notifier-1", String::new), "unarmed: a window is no kill");
        assert!(f.arm(point, "notifier-1") && f.arm(point, "notifier-1"), "rate 1 arms every second");
        assert!(!f.strike(point, "notifier-2", String::new), "another process's arm is not this one's");
        assert!(f.strike(point, "notifier-1", String::new), "the armed process's next window");
        assert!(!f.strike(point, "notifier-1", String::new), "two arms before a strike are one");
        assert_eq!((f.occurrences[point.index()].load(Ordering::Relaxed), f.fired(point)), (4, 1));
        assert_eq!(f.armed(point), (2, 2));
        let s = f.summary().into_iter().find(|s| s.point == point.name()).unwrap();
        assert!(s.unit.starts_with("second, per process") && s.armed == Some((2, 2)), "{s:?}");
        // Only aimed kills are armed; other points keep their rate per occurrence.
        let other = FaultInjector::new(1, &FaultRates::none().with(FaultPoint::RelayAfterProduce, 1.0))
            .with_aimed(Aimed::PerSecond);
        assert!(!other.arm(FaultPoint::RelayAfterProduce, "relay-1"));
        assert!(other.strike(FaultPoint::RelayAfterProduce, "relay-1", String::new));
        // A schedule pins windows by occurrence, armed or not.
        let pinned = FaultInjector::new(1, &rates)
            .with_schedule(Some(Schedule::parse("kafka.kill_after_fetch:1").unwrap()))
            .with_aimed(Aimed::PerSecond);
        let fired: Vec<bool> = (0..3).map(|_| pinned.strike(point, "notifier-1", String::new)).collect();
        assert_eq!(fired, [false, true, false]);
    }

    #[test]
    fn only_a_consumer_waits_and_only_while_its_group_rebalances() {
        let f = FaultInjector::new(1, &FaultRates::none());
        assert!(!f.waits_for_group("notifier-1"), "a group never read is stable");
        f.set_group_stable(false);
        assert!(f.waits_for_group("notifier-2") && !f.waits_for_group("relay-1") && !f.waits_for_group("workload"));
        f.set_group_stable(true);
        assert!(!f.waits_for_group("notifier-2"));
    }

    #[test]
    fn decisions_replay_and_follow_the_rate() {
        let a: Vec<bool> = (0..10_000).map(|n| decide(42, FaultPoint::RelayAfterProduce, n, 0.1)).collect();
        let b: Vec<bool> = (0..10_000).map(|n| decide(42, FaultPoint::RelayAfterProduce, n, 0.1)).collect();
        assert_eq!(a, b);
        let fired = a.iter().filter(|x| **x).count();
        assert!((800..1200).contains(&fired), "fired {fired} of 10000 at p=0.1");
        let other: Vec<bool> = (0..10_000).map(|n| decide(43, FaultPoint::RelayAfterProduce, n, 0.1)).collect();
        assert_ne!(a, other, "another seed must give other decisions");
    }

    #[test]
    fn zero_and_one_are_never_and_always() {
        assert!((0..1000).all(|n| !decide(1, FaultPoint::WorkloadPoison, n, 0.0)));
        assert!((0..1000).all(|n| decide(1, FaultPoint::WorkloadPoison, n, 1.0)));
    }

    #[test]
    fn injector_counts_and_logs() {
        let rates = FaultRates::none().with(FaultPoint::RelayAfterProduce, 1.0);
        let f = FaultInjector::new(7, &rates);
        assert!(f.strike(FaultPoint::RelayAfterProduce, "relay-1", || "batch of 3".into()));
        assert!(!f.strike(FaultPoint::NotifierBeforeOffsetCommit, "notifier-1", || unreachable!()));
        assert_eq!(f.fired(FaultPoint::RelayAfterProduce), 1);
        assert_eq!(f.log()[0].component, "relay-1");
        let summary = f.summary();
        let point = |p: FaultPoint| summary.iter().find(|s| s.point == p.name()).unwrap();
        assert_eq!(point(FaultPoint::NotifierBeforeOffsetCommit).occurrences, 1);
        assert_eq!(point(FaultPoint::RelayAfterProduce).confirmed, 0, "fired is not confirmed");
    }

    #[test]
    fn a_schedule_fires_exactly_its_occurrences_and_reads_back() {
        let s = Schedule::parse("relay.after_produce:3,1; notifier.mid_batch:0").unwrap();
        assert_eq!(s.to_string(), "relay.after_produce:1,3;notifier.mid_batch:0");
        assert_eq!(Schedule::parse(&s.to_string()).unwrap(), s);
        assert_eq!(Schedule::parse("none").unwrap().to_string(), "none");
        let rates = FaultRates::none()
            .with(FaultPoint::RelayAfterProduce, 0.5)
            .with(FaultPoint::NotifierMidBatch, 0.5)
            .with(FaultPoint::NotifierStall, 1.0);
        let f = FaultInjector::new(9, &rates).with_schedule(Some(s.clone()));
        let fired: Vec<bool> =
            (0..6).map(|_| f.strike(FaultPoint::RelayAfterProduce, "relay-1", String::new)).collect();
        assert_eq!(fired, [false, true, false, true, false, false]);
        assert!(f.strike(FaultPoint::NotifierMidBatch, "notifier-1", String::new));
        assert!(!f.strike(FaultPoint::NotifierMidBatch, "notifier-1", String::new));
        // A point the schedule leaves out never fires, and counts as off.
        assert!((0..50).all(|_| !f.strike(FaultPoint::NotifierStall, "notifier-1", String::new)));
        assert_eq!(f.probability(FaultPoint::NotifierStall), 0.0);
        assert_eq!(f.fired_schedule(), s);
        assert_eq!(f.log()[1].occurrence, Some(3));
    }

    #[test]
    fn bad_schedules_are_refused_with_the_fix() {
        for (text, says) in [
            ("relay.after_produce", "POINT:N"),
            ("relay.nope:1", "not a fault point"),
            ("relay.after_produce:x", "not an occurrence"),
            ("broker.kill:0", "nemesis.timeline"),
            (";", "empty"),
        ] {
            let e = Schedule::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn all_is_in_discriminant_order() {
        // `strike` indexes its arrays by discriminant: a point missing from
        // ALL, or out of order, would index out of bounds or count wrongly.
        for (i, p) in FaultPoint::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i, "{}", p.name());
        }
    }

    #[test]
    fn redelivery_confirms_what_waits_for_it_once() {
        let f = FaultInjector::new(1, &FaultRates::none());
        let a = f.delivered((2, 40), [(2, 40), (2, 41)]);
        f.await_redelivery(FaultPoint::NotifierMidBatch, 1, a);
        f.delivered((2, 39), [(2, 39)]);
        f.delivered((1, 40), [(1, 40)]);
        assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 0, "another message, another partition");
        let again = f.delivered((2, 38), [(2, 38), (2, 39), (2, 40)]);
        assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 1);
        f.settled(again);
        f.delivered((2, 40), [(2, 40)]);
        assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 1, "confirmed once");
    }

    #[test]
    fn a_redelivery_before_the_crash_is_known_still_confirms_it() {
        // A rebalance: notifier B reads the batch notifier A holds, and
        // settles it, before A crashes.
        let f = FaultInjector::new(1, &FaultRates::none());
        let held_by_a = f.delivered((3, 7), [(3, 7), (3, 8)]);
        let held_by_b = f.delivered((3, 7), [(3, 7), (3, 8)]);
        f.settled(held_by_b);
        f.await_redelivery(FaultPoint::NotifierBeforeOffsetCommit, 2, held_by_a);
        assert_eq!(f.confirmed(FaultPoint::NotifierBeforeOffsetCommit), 2);
        // A delivery before this batch was received does not count.
        let earlier = f.delivered((4, 1), [(4, 1)]);
        f.settled(earlier);
        let held = f.delivered((4, 1), [(4, 1)]);
        f.await_redelivery(FaultPoint::NotifierMidBatch, 1, held);
        assert_eq!(f.confirmed(FaultPoint::NotifierMidBatch), 0);
        f.await_next_delivery(FaultPoint::NotifierReplay, (5, 0));
        f.delivered((5, 0), [(5, 0)]);
        assert_eq!(f.confirmed(FaultPoint::NotifierReplay), 1);
    }

    #[test]
    fn the_categories_the_registry_derives_are_the_lists_they_replace() {
        use FaultPoint::*;
        let with = |f: fn(FaultPoint) -> bool| FaultPoint::ALL.iter().copied().filter(|p| f(*p)).collect::<Vec<_>>();
        assert_eq!(
            with(FaultPoint::needs_process),
            [
                ProcessKill,
                ProcessPause,
                ProcessKillPerMessage,
                DbKillAfterCommit,
                KafkaKillAfterProduceAck,
                KafkaKillAfterOffsetCommit,
                KafkaKillAfterFetch,
                DbHoldCommit
            ]
        );
        assert_eq!(
            with(FaultPoint::is_service),
            [BrokerPause, BrokerKill, BrokerKillLeader, DbRestart, DbTerminateBackends]
        );
        assert_eq!(
            with(FaultPoint::proxied),
            [
                NetReset,
                NetBlackhole,
                DbCommitAckLost,
                DbKillAfterCommit,
                KafkaProduceAckLost,
                KafkaKillAfterProduceAck,
                KafkaKillAfterOffsetCommit,
                KafkaKillAfterFetch,
                DbHoldCommit
            ]
        );
        assert_eq!(
            with(FaultPoint::schedulable),
            [NetReset, NetBlackhole, BrokerPause, BrokerKill, BrokerKillLeader, DbRestart, DbTerminateBackends]
        );
        assert_eq!(
            with(FaultPoint::on_kafka_wire),
            [
                KafkaProduceAckLost,
                KafkaKillAfterProduceAck,
                KafkaKillAfterOffsetCommit,
                KafkaKillAfterFetch,
                DbHoldCommit
            ]
        );
        // The names' prefixes, which rules used to read, agree with who strikes.
        for p in FaultPoint::ALL {
            if let Some(c) = p.strike().component() {
                assert!(p.name().starts_with(&format!("{c}.")), "{}", p.name());
            }
        }
    }
}
