//! The fault point registry: every point declared once, and what is
//! generated from it (the rates, the scenario's `[faults]` keys, the
//! reference in docs/fault-points.md).

use serde::{Deserialize, Serialize};

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
        #[derive(Debug, Deserialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields, default)]
        pub struct RawFaults {
            $($(#[$doc])* #[schemars(with = "f64", range(min = 0.0, max = 1.0))] pub $key: toml::Spanned<f64>,)+
            /// `[faults.service]`, `[faults.relay]`, `[faults.notifier]`:
            /// an aimed kill's rate per second for that role's processes,
            /// over the one above.
            #[schemars(with = "Option<AimedRates>")]
            pub service: Option<RawRoleRates>,
            #[schemars(with = "Option<AimedRates>")]
            pub relay: Option<RawRoleRates>,
            #[schemars(with = "Option<AimedRates>")]
            pub notifier: Option<RawRoleRates>,
        }

        impl Default for RawFaults {
            fn default() -> Self {
                Self { $($key: toml::Spanned::new(0..0, 0.0),)+ service: None, relay: None, notifier: None }
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

/// One role's aimed-kill rates as written (`[faults.service]`), each key
/// a fault point's key with where it was written.
pub type RawRoleRates = toml::Spanned<std::collections::BTreeMap<String, toml::Spanned<f64>>>;

/// The schema of a role's own rates (`[faults.service]`): a table keyed by
/// the aimed kills' `[faults]` keys, each a probability.
pub struct AimedRates;

impl schemars::JsonSchema for AimedRates {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AimedRates".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let keys: serde_json::Map<String, serde_json::Value> = FaultPoint::ALL
            .iter()
            .filter(|p| p.role_rated())
            .map(|p| {
                let rate = serde_json::json!({ "type": "number", "minimum": 0, "maximum": 1, "description": p.what() });
                (p.key().to_string(), rate)
            })
            .collect();
        schemars::json_schema!({
            "description": "An aimed kill's rate per second for this role's processes, by its `[faults]` key.",
            "type": "object",
            "properties": keys,
            "additionalProperties": false,
        })
    }
}

/// The schema of a `[[nemesis.timeline]]` entry's `fault`: the name of a
/// point the timeline may schedule.
pub struct TimelineFault;

impl schemars::JsonSchema for TimelineFault {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TimelineFault".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<serde_json::Value> = FaultPoint::ALL
            .iter()
            .filter(|p| p.schedulable())
            .map(|p| serde_json::json!({ "const": p.name(), "description": p.what() }))
            .collect();
        schemars::json_schema!({ "type": "string", "oneOf": names })
    }
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
        what "the harness `SIGKILL`s the component's process the moment the fault proxy reads the acknowledgement, before passing it on (the transaction is durable; written first, a process scheduled before the proxy could act on it): for any consumer, its own included, a kill between its transaction and its offset commit. Only a commit whose transaction changed rows is an occurrence (the server's tags `INSERT 0 3`, `UPDATE 1` before it): an empty or read-only commit, an idle poll, holds no work to lose. The report counts both kinds",
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
        what "the harness `SIGKILL`s the process the moment the fault proxy reads the `Produce` response, before passing it on (the broker has appended the batch): for any relay, its own included, a kill between the broker's ack and the outbox mark",
        confirmed by "the process seen ending by SIGKILL";
    /// The fault proxy lets the group coordinator's answer to an
    /// `OffsetCommit` through and SIGKILLs the component's process right
    /// after: for a consumer that commits its offsets before its database
    /// commit (by hand, or by `enable.auto.commit`), a kill inside its
    /// window, every time.
    KafkaKillAfterOffsetCommit = "kafka.kill_after_offset_commit", key kafka_kill_after_offset_commit, per "offset commit acknowledged to a component process", by KafkaWireKill, confirm Seen,
        what "the harness `SIGKILL`s the process the moment the fault proxy reads the `OffsetCommit` response, before passing it on (the offsets are committed). A consumer whose offsets run ahead of its database (committed before its transaction, or by `enable.auto.commit` while a batch is being handled) loses that work; a correct one, whose offsets follow its commit, loses nothing and gets the rest again",
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
        what "a `COMMIT` is an occurrence only when the server's tags show its transaction changed rows (an empty or read-only one is passed on). The fault proxy holds the `COMMIT` (a simple query `COMMIT` or `END`, or one parsed in the extended protocol, as pgjdbc sends it) for up to 6 s, longer than the 5 s auto-commit interval of librdkafka and the Java client, and watches the process's Kafka wire. If an `OffsetCommit` is answered while the transaction is open, before the `COMMIT` or during the hold, the harness `SIGKILL`s the process and the `COMMIT` never reaches the server: the offsets are ahead of a transaction that rolls back. A consumer that commits its offsets only after its database commit is never killed by it; the hold ends and the `COMMIT` goes on. A service's held `COMMIT` (a process that writes the outbox) goes on after the hold while its other requests commit: rows committed out of insert order, counted as overtakes when another writer committed meanwhile. While a hold lasts, no other fault strikes its process",
        confirmed by "the process seen ending by SIGKILL, or the hold seen ending with the offsets unmoved";
    /// A consumer made a zombie inside its transaction: the fault proxy
    /// lets its first statement after `BEGIN` go and the harness stops the
    /// process past its session timeout, before its second; its group
    /// gives its partitions away, and their new owner handles the same
    /// messages while the zombie's transaction is open. It wakes and goes
    /// on. Only a claim that is no unique guard (read, then written) lets
    /// both apply them.
    DbPauseInTransaction = "db.pause_in_transaction", key db_pause_in_transaction, per "transaction of a consumer (opened by a `BEGIN`, as a simple query or in the extended protocol), its first statement sent", by DbWireKill, confirm Seen,
        what "a consumer (a notifier slot) opens a transaction and sends its first statement (the inbox's claim, or its read of the inbox); the fault proxy lets it through and the harness `SIGSTOP`s the process before its second, for 6 s more than `[nemesis] pause_secs` (unset: 8 s past its session timeout: the group notices, gives the partitions away, and their new owner fetches them). Its group gives its partitions away while its transaction is open, and their new owner handles the same messages; then the zombie wakes and finishes its transaction, 3 s out of the other faults' reach. A consumer whose claim is a unique insert holds it: the new owner waits on it and finds it taken. One that reads its inbox first and writes it after (check-then-act) took nothing: both find the messages unhandled and both apply them. While it lasts, no other fault strikes the process, nor the other consumers (the new owner must live to handle the messages). The next zombie waits as long as this one lasted: the consumers' other faults keep half their seconds",
        confirmed by "the process seen stopped, then woken with its transaction still open";
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
    /// The payment service holds a transaction open after its inserts and
    /// before its COMMIT, while the other producers commit: insert order
    /// (the outbox's `seq`) and commit order part.
    WorkloadSlowCommit = "workload.slow_commit", key workload_slow_commit, per "transaction of the payment service", by Workload, confirm Seen,
        what "the payment service holds its transaction open for 50 to 500 ms (drawn per firing) after its inserts and before its `COMMIT`, while its other producers commit: rows with a lower `seq` become visible after rows with a higher one. A relay that keeps the highest `seq` it published as its cursor leaves them behind. On SQLite, whose one writer holds the database for the whole transaction, it only slows the writers",
        confirmed by "the held transaction committed after its hold";
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
    /// is per second of a process's life by default, or per window
    /// (`[nemesis] aimed`, [`Aimed`]).
    pub fn aimed(self) -> bool {
        use FaultPoint::*;
        matches!(
            self,
            DbKillAfterCommit
                | DbHoldCommit
                | DbPauseInTransaction
                | KafkaKillAfterOffsetCommit
                | KafkaKillAfterFetch
                | KafkaKillAfterProduceAck
        )
    }

    /// Whether `[faults.service]`, `[faults.relay]` or `[faults.notifier]`
    /// may give it a rate of its own: the aimed kills (per second), and an
    /// ambiguous commit (per commit), which a consumer's few commits would
    /// otherwise rarely meet beside a service's and relays' many.
    pub fn role_rated(self) -> bool {
        self.aimed() || self == FaultPoint::DbCommitAckLost
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
         Generated from the registry (`fault_points!` in `src/faults/registry.rs`); \
         a test fails when this file and the registry differ. Keys in `[faults]` are the \
         point names with `_` for `.`. A fault counts as *fired* when the injector decides it, \
         and as *confirmed* only when the harness sees its effect.\n\n\
         **Aimed kills** (`db.kill_after_commit`, `db.hold_commit`, `db.pause_in_transaction`, `kafka.kill_after_offset_commit`, \
         `kafka.kill_after_fetch`, `kafka.kill_after_produce_ack`) strike a process at a window of its protocol. \
         Their rate is per second of a process's life: each second is a draw at the rate, a draw that fires \
         arms the process, and one of its next four windows of the point's kind (the table's *per*), drawn from \
         the seed, is struck: a program's windows come in bursts, and the first after a quiet second is always \
         a burst's first. A process is armed only for the windows it can meet: a fetch, an offset commit \
         and a zombie's transaction are a consumer's (a notifier slot's), a produce's acknowledgement a relay's \
         or a service's. A program that \
         commits once per message and one that commits per batch of ten then take about the same number of kills \
         from one scenario, where per window the first takes ten times as many. `[nemesis] aimed = \
         \"per-occurrence\"` reads the rate per window instead (the shipped scenarios sized that way say so); \
         a file that sets an aimed rate and no `aimed` key is read per second, and the run warns at its start. \
         A replay's `--schedule` names windows either way. Every other point keeps its rate per occurrence: a \
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
            Strike::BothWiresKill => "the same as `kafka.produce_ack_lost`, and a program that runs as a process (a consumer's hold may kill it; a service's is let through, reordering its commits)",
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
    /// once a second of its life, and an armed process is struck at one of its
    /// next four windows of the point's kind: the same scenario takes about the same
    /// number of kills from either program, and every kill still lands in
    /// the window it aims at.
    Aimed {
        /// Each window is an occurrence, decided at the rate.
        PerOccurrence = "per-occurrence",
        /// Each second of a process's life is a draw at the rate; a draw
        /// that fires arms the process, and one of its next four windows
        /// (drawn from the seed) is struck.
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
    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// A stable per-point salt, so points do not share a decision stream.
    pub(super) fn salt(self) -> u64 {
        self.name().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    }
}
