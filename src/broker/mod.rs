//! The broker boundary: everything the pipeline asks of a message broker,
//! and nothing of how a given broker does it. A broker here is a log with
//! numbered lanes and consumer groups, as Jepsen's Kafka test models one:
//! the relay produces a batch and awaits its acks; the notifier consumes
//! in a group and commits its positions by hand; the run creates the
//! topic, asks what the group has yet to take (its backlog) and whether it
//! has settled; the verifier reads every lane whole. Where a message sits
//! in its lane is the broker's ([`Position`], opaque; [`Packed`] in eight
//! bytes): only the dead letters' columns open one outside this folder.
//!
//! - `kafka/`: Apache Kafka through rdkafka, and librdkafka's mock cluster
//!   for the embedded mode. The mock's quirks live there and nowhere else.
//! - `memory.rs`: an in-memory broker with the same semantics (a group,
//!   committed offsets, redelivery after a member leaves), so that the
//!   relay's and the notifier's crash semantics can be unit-tested.
//!
//! A new broker is a new folder here implementing [`Broker`], [`Producer`]
//! and [`Consumer`], and the lines of [`open`], [`attach`] and [`ping`]
//! that reach it: nothing outside this folder names a broker's kind
//! (tests/layers.rs checks it).
//! The message envelope is built and parsed in [`crate::domain::events`].

pub mod kafka;
#[cfg(test)]
pub(crate) mod memory;
mod position;
mod read;

pub use kafka::READ_ISOLATION;
pub use position::{range, Packed, Position, Stretch};
pub use read::read_checked;

use crate::domain::events::Envelope;
use crate::error::Result;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// A consumer group as the broker describes it ([`Broker::group`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupState {
    pub members: usize,
    pub settled: bool,
}

/// A topic as the broker is asked about it: its name, and how many
/// ordering lanes it has (Kafka's partitions, the scenario's `[topic]
/// partitions`). Built once per run, so no caller passes the count apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    pub name: String,
    pub lanes: i32,
}

impl Topic {
    pub fn new(name: impl Into<String>, lanes: i32) -> Self {
        Self { name: name.into(), lanes }
    }
}

/// A run's broker, shared by every component of the run.
pub type SharedBroker = Arc<dyn Broker>;

/// The run's broker: a running one at `bootstrap`, checked to answer, or
/// without one, the embedded mode's, started in this process for the run.
pub async fn open(bootstrap: Option<&str>) -> Result<SharedBroker> {
    Ok(match bootstrap {
        Some(b) => Arc::new(kafka::Kafka::connect(b).await?),
        None => Arc::new(kafka::Kafka::embedded()?),
    })
}

/// Who attaches to a broker another process runs, which sets how long a
/// consumer's group may take to form on the embedded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attacher {
    /// A component process of the run (a relay, a notifier).
    Component,
    /// The harness itself: the fault proxy's lanes, `chaos clean`.
    Harness,
}

/// A broker another process runs, at `bootstrap`; `embedded` when it is the
/// embedded mode's, started by the run's harness.
pub fn attach(bootstrap: &str, embedded: bool, who: Attacher) -> SharedBroker {
    match who {
        Attacher::Component => Arc::new(kafka::Kafka::for_component(bootstrap, embedded)),
        Attacher::Harness => Arc::new(kafka::Kafka::attach(bootstrap, embedded)),
    }
}

/// Checks that the broker at `bootstrap` answers within `timeout`: the id
/// and address of each of its nodes.
pub async fn ping(bootstrap: &str, timeout: Duration) -> Result<Vec<(i32, String)>> {
    kafka::ping(bootstrap, timeout).await
}

/// What a producer waits for before the broker acks a send. The broker
/// takes it as a value, so it knows nothing of the scenario that chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerAcks {
    /// Every in-sync replica, with idempotence: no duplicates from the
    /// producer's own retries.
    AllReplicasIdempotent,
    /// The partition leader alone, no idempotence.
    LeaderOnly,
}

/// A message as a consumer or the verifier received it, the envelope's
/// parts still raw bytes: what is missing or unreadable is decided by
/// [`crate::domain::events::decode`], the same way for the notifier and for the verifier.
#[derive(Debug, Default, Clone, Copy)]
pub struct Delivery<'a> {
    pub position: Position,
    pub key: Option<&'a [u8]>,
    pub event_id: Option<&'a [u8]>,
    pub event_type: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
}

/// A message broker as the pipeline uses it. Blocking methods say so: call
/// them off the async threads (`spawn_blocking`) when they may wait.
pub trait Broker: Send + Sync {
    /// What the report and the banner call it: "kafka", "librdkafka mock
    /// cluster", "in-memory".
    fn kind(&self) -> &'static str;

    /// The address other clients of the run connect to (a program under
    /// test is given it as `CHAOS_BROKERS`); empty when there is none.
    fn bootstrap(&self) -> &str;

    /// True for the embedded mode's broker, which a component process must
    /// be told about, and whose group joins take longer.
    fn embedded(&self) -> bool;

    /// Takes the broker down or up, or sets the round trip it adds to every
    /// request: the embedded mode's service faults, through the mock
    /// cluster's own controls. False when this broker has none (a real
    /// broker is paused and killed as a process instead).
    fn outage(&self, _what: Outage) -> bool {
        false
    }

    /// The session timeout a consumer gets when `wanted` is asked for.
    fn session_timeout(&self, wanted: Duration) -> Duration {
        wanted
    }

    /// Creates `topic` with its lanes and waits for it.
    fn create_topic<'a>(&'a self, topic: &'a Topic) -> BoxFuture<'a, Result<()>>;

    /// A producer as a relay uses it: no duplicates from its own retries,
    /// order kept per partition, acks from every replica.
    fn producer(&self) -> Result<Box<dyn Producer>>;

    /// A relay's producer with the acks the scenario asks for
    /// (`relay.producer`); a broker with no such setting gives its
    /// [`Broker::producer`].
    fn producer_for(&self, _acks: ProducerAcks) -> Result<Box<dyn Producer>> {
        self.producer()
    }

    /// The address of the broker node that serves `topic`'s first lane (on
    /// Kafka, the leader of partition 0), as the cluster says now: the node
    /// a nemesis kills to make the cluster fail over. None when it cannot
    /// say. Blocking.
    fn serving_node(&self, _topic: &str) -> Option<String> {
        None
    }

    /// A member of `spec.group`, made but not yet in it ([`Consumer::join`]).
    fn consumer(&self, spec: ConsumerSpec) -> Result<Box<dyn Consumer>>;

    /// Low and high watermark of each partition of `topic`. Blocking.
    fn watermarks(&self, topic: &Topic) -> Result<Vec<(i64, i64)>>;

    /// How many messages the topic holds now. Blocking.
    fn held(&self, topic: &Topic) -> Result<i64> {
        Ok(self.watermarks(topic)?.iter().map(|(low, high)| high - low).sum())
    }

    /// How many messages were ever written to `topic` (`held` less what
    /// retention removed): the sum of its lanes' ends. Blocking.
    fn written(&self, topic: &Topic) -> Result<i64> {
        Ok(self.watermarks(topic)?.iter().map(|(_, high)| high).sum())
    }

    /// How many messages `group` has taken from `topic`: its committed
    /// positions, summed over the lanes it has committed on; None when it
    /// has committed on none. Blocking.
    fn taken(&self, group: &str, topic: &Topic) -> Result<Option<i64>>;

    /// What `group` has yet to take from `topic`: per lane, the messages
    /// after its committed position, summed (Kafka's lag, which the
    /// adapter reads without counting a transaction's markers).
    fn backlog<'a>(&'a self, group: &'a str, topic: &'a Topic) -> BoxFuture<'a, Result<i64>>;

    /// The group's members and whether it has settled (its last rebalance
    /// over, every member assigned), as the broker says; None when the
    /// broker cannot say. What "settled" means for a broker is its
    /// adapter's to decide.
    fn group<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<Option<GroupState>>>;

    /// Reads every partition from its low to its high watermark as found
    /// at the start, handing each message to `sink`, within `limit`. Says
    /// per partition what it found and how much it read, for the reader's
    /// check of its own read. Blocking.
    fn read_topic(&self, topic: &Topic, limit: Duration, sink: &mut dyn FnMut(Delivery<'_>)) -> Result<Vec<Span>>;

    /// Every topic and consumer group the broker has, for `chaos clean`.
    fn list_names(&self) -> BoxFuture<'_, Result<(Vec<String>, Vec<String>)>>;

    /// Deletes these topics and groups.
    fn delete_names<'a>(&'a self, topics: &'a [String], groups: &'a [String]) -> BoxFuture<'a, Result<()>>;

    /// Stops what the broker runs in process (the mock cluster).
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A mock broker's service fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    Down,
    Up,
    /// Every request waits this long for its answer (zero: none).
    RoundTrip(Duration),
}

/// One partition as the verifier's read found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub low: i64,
    pub high: i64,
    /// Messages the read handed on from between the two watermarks.
    pub read: i64,
    /// Offsets the read passed that hold no message a `read_committed`
    /// reader receives: a transaction's commit or abort marker, or an
    /// aborted record. Zero on a topic no transaction wrote.
    pub skipped: i64,
}

/// A relay's producer.
pub trait Producer: Send + Sync {
    /// Sends every message of `batch` to `topic`, all in flight at once.
    /// With `await_acks`, waits for every ack and fails with the first
    /// delivery error; without (the fire-and-forget mistake), returns once
    /// they are queued.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        batch: &'a [Envelope<'a>],
        await_acks: bool,
    ) -> BoxFuture<'a, std::result::Result<(), String>>;
}

/// Told each rebalance's outcome: how many partitions the member now holds.
pub type OnAssign = Arc<dyn Fn(usize) + Send + Sync>;

/// Who a consumer is and what it reads.
#[derive(Clone)]
pub struct ConsumerSpec {
    pub group: String,
    pub topic: String,
    /// Stable across a notifier's incarnations: its static membership id
    /// where the broker uses one.
    pub member: String,
    pub session: Duration,
    pub on_assign: OnAssign,
}

/// A notifier incarnation's consumer: one member of the group, offsets
/// committed by hand. Dropping it is the member leaving (or, for a crash,
/// vanishing): whatever it did not commit is delivered again.
pub trait Consumer: Send + Sync {
    /// Joins the group: subscribes to the topic.
    fn join(&self) -> Result<()>;

    /// Gets ready to join quickly: connects and reads the topic's metadata
    /// (a spare consumer made while the current one works). Blocking.
    fn warm(&self) {}

    /// Waits up to `first` for one message, then takes whatever follows
    /// within `gather` of the previous one, up to `max` in all, handing each
    /// to `each`. Returns how many; 0 when none came (a consumer error is
    /// logged and counts as none).
    fn poll_batch<'a>(
        &'a self,
        max: usize,
        first: Duration,
        gather: Duration,
        each: &'a mut (dyn FnMut(Delivery<'_>) + Send),
    ) -> BoxFuture<'a, usize>;

    /// Commits `next` (per lane, the next position to read: see
    /// [`Position::next`]). With `wait`, returns once the group coordinator
    /// has it.
    fn commit(&self, next: &[Position], wait: bool) -> std::result::Result<(), String>;

    /// An operator's reset: the group's committed positions of these lanes
    /// go back to their start, and this member reads them again from there.
    fn replay_from_start(&self, lanes: &[i32]);

    /// A crash that keeps the membership: every position not committed is
    /// forgotten and reading goes on from the group's committed ones, so
    /// what a restart would deliver again is delivered again. True when the
    /// member did so; false when it cannot, and the crash must drop it and
    /// start a new member, as a process's crash does. A broker whose
    /// rejoins are slow does it (the mock cluster's cost about a second).
    fn crash_in_place(&self) -> bool {
        false
    }

    /// Asked when a poll brought nothing: whether this member can never
    /// work again and must be replaced by a new one.
    fn replace(&self) -> Option<Replace> {
        None
    }
}

/// Why a consumer must be replaced ([`Consumer::replace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replace {
    /// The client failed for good: a fatal error (a static member fenced
    /// after the group coordinator failed over, for one). Such a member
    /// only ever polls nothing. An error of the component's.
    Failed(String),
    /// The broker has left this member, whose notifier never saw a
    /// rebalance, out of the group for so long that a new member is the
    /// way in (the mock cluster sometimes does). Not an error of the
    /// component's.
    Unjoined,
}

/// Drops `value` off the async threads when there are any: a Kafka
/// client's drop blocks until its threads are joined.
pub(crate) fn drop_off_runtime<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(move || drop(value));
        }
        Err(_) => drop(value),
    }
}

/// A client whose drop blocks, dropped with [`drop_off_runtime`].
pub(crate) struct OffRuntime<T: Send + 'static>(std::mem::ManuallyDrop<T>);

impl<T: Send + 'static> OffRuntime<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(std::mem::ManuallyDrop::new(value))
    }
}

impl<T: Send + 'static> std::ops::Deref for OffRuntime<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Send + 'static> Drop for OffRuntime<T> {
    fn drop(&mut self) {
        // SAFETY: the value is taken once, here, and never used again.
        let value = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        drop_off_runtime(value);
    }
}

/// Watches how many messages were ever written to `topic` (the sum of its
/// high watermarks), every `every`, until `stop` says so; sends each growth.
pub fn watch_topic_growth(
    broker: SharedBroker,
    topic: Topic,
    every: Duration,
    stop: impl Fn() -> bool + Send + 'static,
    grew: tokio::sync::mpsc::UnboundedSender<u64>,
) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        let mut seen = 0i64;
        while !stop() {
            if let Ok(marks) = broker.watermarks(&topic) {
                let total: i64 = marks.iter().map(|(_, high)| high).sum();
                if total > seen {
                    if grew.send((total - seen) as u64).is_err() {
                        return;
                    }
                    seen = total;
                }
            }
            std::thread::sleep(every);
        }
    })
}
