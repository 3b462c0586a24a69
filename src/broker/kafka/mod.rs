//! Apache Kafka through rdkafka: the broker adapter of every run. The
//! embedded mode runs librdkafka's own mock cluster in process (`mock.rs`);
//! it speaks the Kafka protocol to the same clients, so the same code
//! serves both, and the mock's quirks are decided here.

mod consumer;
pub mod mock;
mod producer;

use super::{Broker, ConsumerSpec, GroupState, Span, Topic};
use crate::broker::Delivery;
use crate::error::{Error, Result};
use futures::future::BoxFuture;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use consumer::KafkaConsumer;
use producer::KafkaProducer;

use crate::domain::names::CONNECT_TIMEOUT;

/// How long one poll of the verifier's reader waits before it checks its
/// time limit.
const READ_POLL: Duration = Duration::from_millis(200);

/// The longest session the mock cluster gets: it keeps a dropped member
/// until its session times out (measured: about one session timeout per
/// notifier crash), so the embedded mode uses 1 s to keep crashes cheap.
const MOCK_SESSION: Duration = Duration::from_secs(1);
/// The same for notifiers that are OS processes. With 1 s, on this 2-core
/// machine, members of busy processes timed out between heartbeats, the
/// group rebalanced over and over, and the mock cluster aborted the whole
/// run on its own assertion (`!member->resp`, a member's second request
/// while its first was held): 4 of 7 runs of `selftest --only "inbox off"
/// --components process`, old and new builds alike. With 3 s: 0 of 3, and
/// 18-25 s a run instead of 27-86 s.
const MOCK_SESSION_PROCESSES: Duration = Duration::from_secs(2);
/// How long a new member in a component process waits for its first
/// assignment before it is replaced: a killed predecessor stays in the
/// group until its session times out, and the rebalance that follows waits
/// up to a session more. Replacing the member sooner only restarts that
/// rebalance (measured with 2 s and a 3 s session: each new notifier
/// process of smoke.toml was replaced twice and joined after about 8 s).
const MOCK_JOIN_WAIT_PROCESSES: Duration = Duration::from_secs(5);

/// Client settings shared by every Kafka client of a run. The timeouts keep
/// librdkafka's own retry loops bounded.
pub fn config(brokers: &str) -> ClientConfig {
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

/// A Kafka cluster, real or the in-process mock.
pub struct Kafka {
    bootstrap: String,
    /// The embedded mode's mock cluster, when this process runs it.
    mock: Mutex<Option<mock::MockCluster>>,
    /// The mock cluster's clients, in this process or another.
    embedded: bool,
    /// The longest session a consumer gets on the mock cluster, and how
    /// long a new member waits to be joined before it is replaced.
    mock_session: Duration,
    mock_join_wait: Duration,
    /// One client for the watermark reads a run makes every 50 ms.
    probe: Mutex<Option<BaseConsumer>>,
    /// One client, with its group's id, for the committed offsets the
    /// run's series reads every 250 ms: a client made per read would
    /// connect (and start its threads) four times a second.
    offsets: Mutex<Option<(String, BaseConsumer)>>,
    /// Per notifier member, on the mock cluster: its replacements unjoined.
    strandings: Mutex<std::collections::HashMap<String, consumer::Strandings>>,
}

impl Kafka {
    /// A real Kafka, checked to answer.
    pub async fn connect(brokers: &str) -> Result<Self> {
        ping(brokers, CONNECT_TIMEOUT).await?;
        Ok(Self::attach(brokers, false))
    }

    /// librdkafka's mock cluster, started in this process for the run.
    pub fn embedded() -> Result<Self> {
        let m = mock::MockCluster::start()?;
        let kafka = Self::attach(&m.bootstrap, true);
        *kafka.mock.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
        Ok(kafka)
    }

    /// A cluster another process runs.
    pub fn attach(bootstrap: &str, embedded: bool) -> Self {
        Self {
            bootstrap: bootstrap.to_string(),
            mock: Mutex::new(None),
            embedded,
            mock_session: MOCK_SESSION,
            mock_join_wait: consumer::MOCK_JOIN_WAIT,
            probe: Mutex::new(None),
            offsets: Mutex::new(None),
            strandings: Default::default(),
        }
    }

    /// `read` of the consumer group's entries in the coordinator's group
    /// list; None on the mock cluster, which cannot list groups.
    async fn read_group<T: Send + 'static>(
        &self,
        group: &str,
        read: impl FnOnce(&[&rdkafka::groups::GroupInfo]) -> T + Send + 'static,
    ) -> Result<Option<T>> {
        let admin = self.admin()?;
        let group = group.to_string();
        let listed = blocking(move || {
            let list = admin.inner().fetch_group_list(Some(&group), CONNECT_TIMEOUT);
            // Dropped here, off the async threads: its drop blocks.
            Ok(list.map(|l| read(&l.groups().iter().filter(|g| g.name() == group).collect::<Vec<_>>())))
        })
        .await?;
        match listed {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.to_string().contains("UnsupportedFeature") => Ok(None),
            Err(e) => Err(Error::kafka("describing the consumer group", e)),
        }
    }

    /// The run's cluster as a component process of the run sees it.
    pub fn for_component(bootstrap: &str, embedded: bool) -> Self {
        let mut kafka = Self::attach(bootstrap, embedded);
        kafka.mock_session = MOCK_SESSION_PROCESSES;
        kafka.mock_join_wait = MOCK_JOIN_WAIT_PROCESSES;
        kafka
    }

    fn admin(&self) -> Result<AdminClient<DefaultClientContext>> {
        config(&self.bootstrap).create().map_err(|e| Error::kafka("creating the admin client", e))
    }
}

/// Checks that the brokers answer within `timeout`. Returns the broker ids
/// and addresses.
pub async fn ping(brokers: &str, timeout: Duration) -> Result<Vec<(i32, String)>> {
    let admin: AdminClient<DefaultClientContext> = config(brokers)
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

/// Runs a blocking call on the blocking threads and flattens its errors.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(e.to_string()))?
}

impl Broker for Kafka {
    fn kind(&self) -> &'static str {
        if self.embedded {
            "librdkafka mock cluster"
        } else {
            "kafka"
        }
    }

    fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn embedded(&self) -> bool {
        self.embedded
    }

    fn outage(&self, what: crate::broker::Outage) -> bool {
        match &*self.mock.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(m) => m.outage(what),
            None => false,
        }
    }

    fn session_timeout(&self, wanted: Duration) -> Duration {
        if self.embedded {
            wanted.min(self.mock_session)
        } else {
            wanted
        }
    }

    fn create_topic<'a>(&'a self, topic: &'a Topic) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Some(m) = self.mock.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                return m.create_topic(&topic.name, topic.lanes);
            }
            create_topic(self.admin()?, &self.bootstrap, &topic.name, topic.lanes).await
        })
    }

    fn producer(&self) -> Result<Box<dyn super::Producer>> {
        Ok(Box::new(KafkaProducer::new(&self.bootstrap, super::ProducerAcks::AllReplicasIdempotent)?))
    }

    fn producer_for(&self, acks: super::ProducerAcks) -> Result<Box<dyn super::Producer>> {
        Ok(Box::new(KafkaProducer::new(&self.bootstrap, acks)?))
    }

    fn serving_node(&self, topic: &str) -> Option<String> {
        let c: BaseConsumer = config(&self.bootstrap).create().ok()?;
        let md = c.fetch_metadata(Some(topic), Duration::from_secs(5)).ok()?;
        let id = md.topics().first()?.partitions().iter().find(|p| p.id() == 0)?.leader();
        md.brokers().iter().find(|b| b.id() == id).map(|b| format!("{}:{}", b.host(), b.port()))
    }

    fn consumer(&self, spec: ConsumerSpec) -> Result<Box<dyn super::Consumer>> {
        let strandings = self.embedded.then(|| {
            let mut all = self.strandings.lock().unwrap_or_else(|p| p.into_inner());
            (all.entry(spec.member.clone()).or_default().clone(), self.mock_join_wait)
        });
        Ok(Box::new(KafkaConsumer::new(&self.bootstrap, strandings, spec)?))
    }

    fn watermarks(&self, topic: &Topic) -> Result<Vec<(i64, i64)>> {
        let mut probe = self.probe.lock().unwrap_or_else(|p| p.into_inner());
        if probe.is_none() {
            *probe = Some(config(&self.bootstrap).create().map_err(|e| Error::kafka("creating the topic probe", e))?);
        }
        let Some(c) = probe.as_ref() else { return Ok(Vec::new()) };
        (0..topic.lanes)
            .map(|p| {
                c.fetch_watermarks(&topic.name, p, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading watermarks", e))
            })
            .collect()
    }

    fn taken(&self, group: &str, topic: &Topic) -> Result<Option<i64>> {
        let mut offsets = self.offsets.lock().unwrap_or_else(|p| p.into_inner());
        if offsets.as_ref().is_none_or(|(g, _)| g != group) {
            // A group.id and no subscription: it reads the group's offsets
            // and never joins it, so the consumers never rebalance for it.
            let c: BaseConsumer = config(&self.bootstrap)
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .create()
                .map_err(|e| Error::kafka("creating the offsets probe", e))?;
            if let Some(old) = offsets.replace((group.to_string(), c)) {
                super::drop_off_runtime(old);
            }
        }
        let Some((_, c)) = offsets.as_ref() else { return Ok(None) };
        let mut tpl = TopicPartitionList::new();
        for p in 0..topic.lanes {
            tpl.add_partition(&topic.name, p);
        }
        let committed =
            c.committed_offsets(tpl, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading committed offsets", e))?;
        let on: Vec<i64> = (0..topic.lanes)
            .filter_map(|p| match committed.find_partition(&topic.name, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            })
            .collect();
        Ok((!on.is_empty()).then(|| on.iter().sum()))
    }

    fn backlog<'a>(&'a self, group: &'a str, topic: &'a Topic) -> BoxFuture<'a, Result<i64>> {
        let (brokers, group, topic) = (self.bootstrap.clone(), group.to_string(), topic.clone());
        Box::pin(blocking(move || group_lag(&brokers, &group, &topic.name, topic.lanes)))
    }

    fn group<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<Option<GroupState>>> {
        // Only "Stable" is settled: "PreparingRebalance" and
        // "CompletingRebalance" are a rebalance under way, "Empty" a group
        // whose every member is gone.
        Box::pin(self.read_group(group, |mine| GroupState {
            members: mine.iter().map(|g| g.members().len()).sum(),
            settled: mine.iter().any(|g| g.state() == "Stable"),
        }))
    }

    fn read_topic(&self, topic: &Topic, limit: Duration, sink: &mut dyn FnMut(Delivery<'_>)) -> Result<Vec<Span>> {
        read_topic(&self.bootstrap, &topic.name, topic.lanes, limit, sink)
    }

    fn list_names(&self) -> BoxFuture<'_, Result<(Vec<String>, Vec<String>)>> {
        Box::pin(async move {
            let admin = self.admin()?;
            let listed = blocking(move || {
                let topics = admin
                    .inner()
                    .fetch_metadata(None, CONNECT_TIMEOUT)
                    .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>());
                let groups = admin
                    .inner()
                    .fetch_group_list(None, CONNECT_TIMEOUT)
                    .map(|g| g.groups().iter().map(|g| g.name().to_string()).collect::<Vec<_>>());
                Ok(topics.and_then(|t| groups.map(|g| (t, g))))
            })
            .await?;
            listed.map_err(|e| Error::KafkaUnreachable { brokers: self.bootstrap.clone(), cause: e.to_string() })
        })
    }

    fn delete_names<'a>(&'a self, topics: &'a [String], groups: &'a [String]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let admin = self.admin()?;
            let opts = AdminOptions::new().operation_timeout(Some(CONNECT_TIMEOUT));
            if !groups.is_empty() {
                let names: Vec<&str> = groups.iter().map(String::as_str).collect();
                // A group still in use cannot go; it is listed again next time.
                let _ = tokio::time::timeout(CONNECT_TIMEOUT, admin.delete_groups(&names, &opts)).await;
            }
            let deleted = if topics.is_empty() {
                Ok(())
            } else {
                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                match tokio::time::timeout(CONNECT_TIMEOUT, admin.delete_topics(&names, &opts)).await {
                    Err(_) => Err(Error::Kafka { context: "deleting topics".into(), cause: "timed out".into() }),
                    Ok(r) => r.map(|_| ()).map_err(|e| Error::kafka("deleting topics", e)),
                }
            };
            super::drop_off_runtime(admin);
            deleted
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        let m = self.mock.lock().unwrap_or_else(|p| p.into_inner()).take();
        let probe = self.probe.lock().unwrap_or_else(|p| p.into_inner()).take();
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || drop(probe)).await;
            if let Some(m) = m {
                m.stop().await;
            }
        })
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        if let Some(p) = self.probe.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            super::drop_off_runtime(p);
        }
        if let Some(o) = self.offsets.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            super::drop_off_runtime(o);
        }
    }
}

/// Creates the run's topic and waits for the broker to confirm it.
async fn create_topic(
    admin: AdminClient<DefaultClientContext>,
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> Result<()> {
    let opts = AdminOptions::new().operation_timeout(Some(CONNECT_TIMEOUT)).request_timeout(Some(CONNECT_TIMEOUT));
    // The broker's default replication factor (-1): 3 on `scripts/services.sh
    // up cluster`, 1 on the single broker. (The mock cluster's topics are
    // made through its own handle, not here.)
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let result =
        tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(2), admin.create_topics([&new], &opts)).await;
    super::drop_off_runtime(admin);
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

/// The group's lag, read by a consumer that never subscribes (so it never
/// joins the group; it only reads the group's committed offsets). Blocking.
fn group_lag(brokers: &str, group: &str, topic: &str, partitions: i32) -> Result<i64> {
    let c: BaseConsumer = config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| Error::kafka("creating the lag probe", e))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed =
        c.committed_offsets(tpl, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading committed offsets", e))?;
    let mut lag = 0;
    for p in 0..partitions {
        let (_, high) =
            c.fetch_watermarks(topic, p, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading watermarks", e))?;
        let done = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => 0,
        };
        let behind = (high - done).max(0);
        // A transactional producer's commit marker takes an offset no
        // consumer receives: a consumer that committed past its last
        // record stays one marker short of the high watermark for ever.
        // A small gap counts only if a record lies in it.
        if behind == 0 || (behind <= MARKER_SLACK && !records_between(brokers, topic, p, done, high)?) {
            continue;
        }
        lag += behind;
    }
    Ok(lag)
}

/// The gap below the high watermark that may be only commit markers.
const MARKER_SLACK: i64 = 2;

/// Whether a committed record lies at an offset in `from..to` of the
/// partition: read as the verifier reads, `read_committed`. Unsure (no
/// answer within a second) is yes.
fn records_between(brokers: &str, topic: &str, partition: i32, from: i64, to: i64) -> Result<bool> {
    let c: BaseConsumer = config(brokers)
        .set("group.id", format!("{topic}.lag-probe"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", READ_ISOLATION)
        .create()
        .map_err(|e| Error::kafka("creating the marker probe", e))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from)).map_err(|e| Error::kafka("assigning", e))?;
    c.assign(&tpl).map_err(|e| Error::kafka("assigning the marker probe", e))?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) if m.offset() < to => return Ok(true),
            Some(_) => {}
            None => {
                let at = c.position().ok().and_then(|l| l.find_partition(topic, partition).map(|e| e.offset()));
                if matches!(at, Some(Offset::Offset(o)) if o >= to) {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// The envelope's parts of a received message, as raw bytes.
pub fn delivery<M: Message>(m: &M) -> Delivery<'_> {
    let mut d = Delivery {
        position: crate::broker::Position::new(m.partition(), m.offset()),
        key: m.key(),
        payload: m.payload(),
        ..Default::default()
    };
    if let Some(headers) = m.headers() {
        for header in headers.iter() {
            match header.key {
                crate::domain::events::HEADER_EVENT_ID => d.event_id = header.value,
                crate::domain::events::HEADER_EVENT_TYPE => d.event_type = header.value,
                _ => {}
            }
        }
    }
    d
}

/// How the verifier reads the topic: committed records only.
pub const READ_ISOLATION: &str = "read_committed";

/// The verifier's read: a consumer of its own (no group membership, no
/// commits), every partition from its low to its high watermark as seen
/// at the start. Blocking.
fn read_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    limit: Duration,
    sink: &mut dyn FnMut(Delivery<'_>),
) -> Result<Vec<Span>> {
    let c: BaseConsumer = config(brokers)
        .set("group.id", format!("{topic}.verifier"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        // Little prefetched: the checkers keep up with the read, and at a
        // million payments the read is the verifier's peak of memory.
        .set("queued.max.messages.kbytes", "8192")
        .set("fetch.max.bytes", "8388608")
        // Said, not left to librdkafka's default (the same): a relay that
        // publishes in transactions (Kafka Connect's exactly-once mode)
        // leaves aborted copies on the log that no consumer of its
        // committed output ever sees, and must not be counted.
        .set("isolation.level", READ_ISOLATION)
        .create()
        .map_err(|e| Error::kafka("creating the verifier's reader", e))?;
    let mut spans = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) =
            c.fetch_watermarks(topic, p, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading watermarks", e))?;
        spans.push(Span { low, high, read: 0, skipped: 0 });
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low)).map_err(|e| Error::kafka("assigning", e))?;
        }
    }
    c.assign(&tpl).map_err(|e| Error::kafka("assigning the topic", e))?;
    let total: i64 = spans.iter().map(|s| s.high - s.low).sum();
    let mut next: Vec<i64> = spans.iter().map(|s| s.low).collect();
    let started = Instant::now();
    while next.iter().zip(&spans).any(|(n, s)| *n < s.high) {
        if started.elapsed() > limit {
            let read: i64 = spans.iter().map(|s| s.read).sum();
            return Err(Error::Kafka {
                context: format!("reading topic {topic} to its end"),
                cause: format!("read {read} of {total} messages in {}s", limit.as_secs()),
            });
        }
        let Some(m) = c.poll(READ_POLL) else {
            // A transaction's commit marker (or an aborted record) may end a
            // partition: no message reaches the high watermark then, the
            // reader's position does.
            if let Ok(at) = c.position() {
                for e in at.elements_for_topic(topic) {
                    let (p, Offset::Offset(o)) = (e.partition() as usize, e.offset()) else { continue };
                    if p < next.len() && o > next[p] {
                        spans[p].skipped += o.min(spans[p].high) - next[p];
                        next[p] = o;
                    }
                }
            }
            continue;
        };
        let m = m.map_err(|e| Error::kafka("reading the topic", e))?;
        let p = m.partition() as usize;
        if p >= spans.len() || m.offset() >= spans[p].high || m.offset() < next[p] {
            continue;
        }
        // Offsets jumped over: markers and aborted records.
        spans[p].skipped += m.offset() - next[p];
        next[p] = m.offset() + 1;
        spans[p].read += 1;
        sink(delivery(&m));
    }
    drop(c);
    Ok(spans)
}
