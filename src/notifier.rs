//! The notifier: M instances in one consumer group, offsets committed by hand.
//!
//! Per micro-batch: ONE database transaction claims the inbox rows and applies
//! the effects of what it newly claimed (see [`crate::store::Store::apply_batch`]);
//! only then are the offsets committed.
//!
//! Fault point `notifier.before_offset_commit`: after the transaction committed
//! and before the offsets are committed, the notifier may crash. It then
//! restarts and the group redelivers the batch; the inbox must absorb it.
//! Restarts use static membership (`group.instance.id`): the new incarnation
//! takes its predecessor's place without waiting out a session timeout. Its
//! consumer is made ahead, while the current one works (`Spare`), as a
//! supervisor keeps a replacement process warm.

use crate::context::{Ctx, Stats};
use crate::error::{Error, Result};
use crate::events;
use crate::faults::{FaultPoint, Held};
use crate::infra::{kafka_config, CONNECT_TIMEOUT};
use crate::scenario::InboxMode;
use crate::store::{BatchFaults, BatchOutcome, Incoming, Modes};
use crate::supervise::{self, Counters, Ending};
use futures::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long the first message of a batch is waited for before re-checking shutdown.
const FIRST_WAIT: Duration = Duration::from_millis(200);
/// How long a notifier's first consumer on the mock cluster may go without
/// completing its join before it is replaced: the mock sometimes leaves one
/// member of a new group unjoined for good (measured: about 1 run in 5 of payments.toml,
/// one of two notifiers had no assignment after 5 s), while joins that
/// complete do so in about 1.1 s.
const MOCK_JOIN_WAIT: Duration = Duration::from_secs(2);
/// How long a seek or a committed-offsets read may take: each asks the group
/// coordinator once, which answers in milliseconds when it is there at all.
const OFFSET_TIMEOUT: Duration = Duration::from_secs(5);
/// How long each further message may take to arrive before the batch closes.
const GATHER_WAIT: Duration = Duration::from_millis(3);

/// The session timeout a notifier uses.
pub fn session_ms(ctx: &Ctx) -> u64 {
    let session = ctx.scenario.notifier.session_timeout.as_millis() as u64;
    if ctx.static_membership {
        session
    } else {
        // The mock cluster keeps a dropped member until its session times
        // out (measured: about one session timeout per notifier crash), so
        // the embedded mode uses a 1 s session to keep crashes cheap.
        session.min(1000)
    }
}

/// How long `notifier.stall` freezes a zombie: long enough for its
/// replacement to rejoin the group and process the same batch.
pub fn stall_duration(ctx: &Ctx) -> Duration {
    Duration::from_millis(2 * session_ms(ctx) + 2000)
}

/// The notifier's consumer context: it reports each rebalance's outcome, so
/// the run can wait for the group to hold every partition before the
/// workload starts (a real service's consumers are up before its traffic).
pub struct Membership {
    stats: std::sync::Arc<Stats>,
    index: usize,
    /// This consumer's join completed (it got an assignment, maybe empty).
    joined: std::sync::atomic::AtomicBool,
}

impl ClientContext for Membership {}

impl ConsumerContext for Membership {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let held = match rebalance {
            Rebalance::Assign(tpl) => tpl.count(),
            _ => 0,
        };
        debug!(notifier = self.index, partitions = held, "rebalance");
        if matches!(rebalance, Rebalance::Assign(_)) {
            self.joined.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.stats.set_assigned(self.index, held);
    }
}

type NotifierConsumer = StreamConsumer<Membership>;

/// A consumer created, connected and subscribed: a notifier incarnation's.
fn consumer(ctx: &Ctx, name: &str, index: usize) -> Result<NotifierConsumer> {
    let c = client(ctx, name, index)?;
    c.subscribe(&[&ctx.names.topic]).map_err(|e| Error::kafka("subscribing the notifier", e))?;
    Ok(c)
}

/// The next incarnation's consumer, made while the current one works, as a
/// supervisor keeps a replacement process warm: it has connected to the
/// broker, found the group coordinator and read the topic's metadata, but
/// holds no membership until it subscribes. A crash still costs a new member
/// joining the group, fetching the committed offsets and reading from them;
/// it no longer waits for three connections and a metadata request first.
struct Spare(Option<tokio::task::JoinHandle<Option<NotifierConsumer>>>);

impl Spare {
    /// Starts making the next incarnation's consumer, off the async threads
    /// (creating a client and reading metadata block).
    fn prepare(ctx: &Ctx, name: &str, index: usize) -> Self {
        let (ctx, name) = (ctx.clone(), name.to_string());
        Spare(Some(tokio::task::spawn_blocking(move || {
            let c = client(&ctx, &name, index).ok()?;
            // With the topic's metadata cached, subscribing joins at once.
            let _ = c.fetch_metadata(Some(&ctx.names.topic), CONNECT_TIMEOUT);
            Some(c)
        })))
    }

    /// The prepared consumer, subscribed; None when there is none.
    async fn take(&mut self, ctx: &Ctx) -> Option<Result<NotifierConsumer>> {
        let c = self.0.take()?.await.ok()??;
        Some(c.subscribe(&[&ctx.names.topic]).map(|_| c).map_err(|e| Error::kafka("subscribing the notifier", e)))
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        // Outside a runtime (it is shutting down) the handle is only
        // detached: the blocking task then drops the consumer itself.
        if let (Some(h), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                if let Ok(Some(c)) = h.await {
                    discard(c);
                }
            });
        }
    }
}

/// A consumer of the notifier group that has not subscribed yet.
fn client(ctx: &Ctx, name: &str, index: usize) -> Result<NotifierConsumer> {
    let session = session_ms(ctx);
    let mut config = kafka_config(&ctx.brokers);
    // librdkafka prefetches up to 64 MB per consumer by default. A
    // micro-batch of 200 events is about 140 KB, so 1 MB still holds several.
    // Measured on the bench scenario at 300,000 payments: peak RSS 381 MB
    // with 8 MB, 183 MB with 1 MB. Real Kafka takes less (below).
    let mut prefetch_kb = 1024;
    if ctx.static_membership {
        config.set("group.instance.id", format!("{}.{name}", ctx.names.group));
        // A fetch answers once 64 KB are there or 50 ms have passed, not at
        // the first byte: fewer, fuller fetches for the broker to serve.
        // Measured on the bench scenario, three interleaved pairs: 20,419 /
        // 22,056 / 21,959 events/s against 19,459 / 21,846 / 19,497 at one
        // byte, and 0.3 s less broker CPU per run. Not on the mock cluster,
        // whose fetch waits were not measured.
        config.set("fetch.min.bytes", "65536");
        // A crash throws the prefetched messages away: the next incarnation
        // fetches and parses them again. 256 KB is about 370 events, nearly
        // two micro-batches. Measured on the bench scenario at 100,000
        // payments, interleaved: 22,860-24,275 events/s in 10 runs (median
        // 23,200) at 256 KB against 20,661-21,976 (median 21,300) in 4 runs
        // at 1 MB and 19,489-22,039 in 3 at 512 KB; 64 KB and 128 KB were no
        // faster. The mock cluster's notifiers rewind in place instead of
        // restarting, so it keeps 1 MB.
        prefetch_kb = 256;
    }
    config
        .set("group.id", &ctx.names.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", session.to_string())
        // Members learn of a rebalance on their next heartbeat; a short one
        // keeps a crashed member's return from stalling the others.
        .set("heartbeat.interval.ms", (session / 3).clamp(100, 250).to_string())
        .set("max.poll.interval.ms", (session * 5).max(30_000).to_string())
        .set("fetch.wait.max.ms", "50")
        .set("queued.max.messages.kbytes", prefetch_kb.to_string())
        .create_with_context(Membership { stats: ctx.stats.clone(), index, joined: Default::default() })
        .map_err(|e| Error::kafka("creating a notifier consumer", e))
}

/// Counts a zombie as active for as long as it lives, panics included: the
/// drain waits for none to be left, or their late effects would land after
/// verification.
struct ZombieGuard(std::sync::Arc<Stats>);

impl ZombieGuard {
    fn new(stats: &std::sync::Arc<Stats>) -> Self {
        Stats::add(&stats.zombies_active, 1);
        Self(stats.clone())
    }
}

impl Drop for ZombieGuard {
    fn drop(&mut self) {
        self.0.zombies_active.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Drops a consumer off the async threads: its drop blocks until closed.
fn discard(c: NotifierConsumer) {
    tokio::task::spawn_blocking(move || drop(c));
}

/// Decodes a received message into what the batch transaction needs. The
/// raw header and payload are copied only for a message that does not
/// decode: they are what its dead-letter row records.
pub fn incoming<M: Message>(m: &M) -> Incoming {
    let events::Header { event_id, event_type } = events::Header::of(m);
    let decoded =
        events::decode(event_id, event_type, m.payload()).map(|d| events::Decoded { partition: m.partition(), ..d });
    let (raw_event_id, raw_payload) = match decoded {
        Ok(_) => (None, String::new()),
        Err(_) => (
            event_id.map(|v| String::from_utf8_lossy(v).into_owned()),
            m.payload().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default(),
        ),
    };
    Incoming { partition: m.partition(), offset: m.offset(), decoded, raw_event_id, raw_payload }
}

/// Runs notifier number `index` until shutdown: the supervisor. Every crash
/// and restart goes through here: the incarnation's consumer is dropped
/// without committing anything (the group sees a member go), the supervisor
/// pauses, and a new incarnation starts with a new consumer (made ahead, on
/// a real broker, by [`Spare`]).
pub async fn run(ctx: Ctx, index: usize) {
    let name = format!("notifier-{index}");
    let cfg = ctx.scenario.notifier.clone();
    let mut shutdown = ctx.shutdown.clone();
    let mut spare = Spare(None);
    loop {
        if shutdown.is_set() {
            return;
        }
        let prepared = tokio::select! {
            _ = shutdown.wait() => return,
            c = spare.take(&ctx) => c,
        };
        let next = prepared.unwrap_or_else(|| consumer(&ctx, &name, index));
        // The mock cluster is left alone: its notifiers rewind in place
        // instead of restarting (see `rewind_to_committed`). A component
        // process lives one incarnation: its replacement is a new process.
        if ctx.static_membership && !crate::component::active() {
            spare = Spare::prepare(&ctx, &name, index);
        }
        let ending = match next {
            Ok(consumer) => {
                let mut inc = Incarnation { ctx: &ctx, name: &name, index, consumer, created: Instant::now() };
                let ending = inc.run(&mut shutdown).await;
                discard(inc.consumer);
                ending
            }
            Err(e) => Ending::Error { what: "starting a consumer", cause: e.to_string() },
        };
        let counters = Counters { crashes: &ctx.stats.notifier_crashes, errors: &ctx.stats.notifier_errors };
        if !supervise::after(ending, &name, counters, cfg.restart_delay, &mut shutdown).await {
            return;
        }
    }
}

/// One life of a notifier: its consumer in the group. A pass reads top to
/// bottom as consume a micro-batch → one transaction (inbox claim and
/// effects) → commit the offsets, with the fault points between.
struct Incarnation<'a> {
    ctx: &'a Ctx,
    name: &'a str,
    index: usize,
    consumer: NotifierConsumer,
    /// When its consumer was made, for the mock cluster's unjoined members.
    created: Instant,
}

/// What one pass of an incarnation did.
enum Step {
    Continue,
    End(Ending),
}

impl Incarnation<'_> {
    async fn run(&mut self, shutdown: &mut crate::context::Shutdown) -> Ending {
        loop {
            match self.step(shutdown).await {
                Step::Continue => {}
                Step::End(e) => return e,
            }
        }
    }

    /// consume → `notifier.mid_batch` / `notifier.stall` → one transaction →
    /// `notifier.before_offset_commit` → commit offsets → `notifier.replay`.
    async fn step(&mut self, shutdown: &mut crate::context::Shutdown) -> Step {
        let (ctx, name) = (self.ctx, self.name);
        let cfg = &ctx.scenario.notifier;
        let batch = match self.gather(shutdown).await {
            Ok(Some(b)) => b,
            Ok(None) => return Step::Continue,
            Err(ending) => return Step::End(ending),
        };
        // What was delivered confirms the faults awaiting a redelivery,
        // before this batch's own faults start awaiting theirs.
        let at = (batch[0].partition, batch[0].offset);
        let held = ctx.faults.delivered(at, batch.iter().map(|m| (m.partition, m.offset)));
        let hit = || format!("batch of {} events, partition {} offset {}", batch.len(), at.0, at.1);
        let faults = BatchFaults {
            crash_mid_batch: ctx.faults.strike(FaultPoint::NotifierMidBatch, name, hit),
            stall: ctx.faults.strike(FaultPoint::NotifierStall, name, hit).then(|| stall_duration(ctx)),
        };
        let tpl = next_offsets(&ctx.names.topic, &batch);
        if cfg.inbox == InboxMode::CommitOffsetFirst {
            // The mistake: acknowledge first, process after.
            let _ = tokio::task::block_in_place(|| self.consumer.commit(&tpl, CommitMode::Sync));
        }
        let modes = Modes { inbox: cfg.inbox, projection: cfg.projection };
        if let Some(stall) = faults.stall {
            if !crate::component::active() {
                self.zombie(batch, modes, faults, stall, held);
                return Step::End(Ending::Crash { confirmed_by_restart: None });
            }
            // In a component process the zombie is this process itself: the
            // harness stops it inside the batch and resumes it after the
            // stall (see `inbox::stall`), and it carries on, late.
        }
        let outcome = match ctx.store.apply_batch(&batch, modes, faults).await {
            Ok(o) => o,
            // Nothing was committed; the batch comes back after the restart.
            Err(e) => {
                ctx.faults.settled(held);
                return Step::End(Ending::Error { what: "a batch transaction", cause: e.to_string() });
            }
        };
        if self.crashes_after(&batch, &outcome, held).await {
            // Partition lists can hold references into the client: release
            // them before the consumer goes, or its destruction waits for them.
            drop(tpl);
            if !ctx.static_membership && rewind_to_committed(&self.consumer, &ctx.names.topic) {
                Stats::add(&ctx.stats.notifier_crashes, 1);
                return Step::Continue;
            }
            return Step::End(Ending::Crash { confirmed_by_restart: None });
        }
        if cfg.inbox != InboxMode::CommitOffsetFirst {
            // Asynchronous, as consumers commit in their loop: the batch's
            // effects are already committed with its inbox rows, so an offset
            // commit lost to a crash only means a redelivery the inbox absorbs.
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                // Usually a rebalance took the partition away; its new owner
                // gets the batch again and the inbox absorbs it.
                debug!(notifier = %name, cause = %e, "offset commit failed");
            }
        }
        drop(tpl);
        ctx.faults.settled(held);
        if ctx.faults.strike(FaultPoint::NotifierReplay, name, hit) {
            self.replay(&batch, at);
        }
        Step::Continue
    }

    /// A micro-batch: the first message waited for (re-checking shutdown
    /// every [`FIRST_WAIT`]), then whatever follows within [`GATHER_WAIT`].
    /// `Ok(None)`: nothing this time.
    async fn gather(&mut self, shutdown: &mut crate::context::Shutdown) -> Result<Option<Vec<Incoming>>, Ending> {
        let ctx = self.ctx;
        let first = tokio::select! {
            _ = shutdown.wait() => return Err(Ending::Shutdown),
            r = tokio::time::timeout(FIRST_WAIT, self.consumer.recv()) => r,
        };
        let first = match first {
            Err(_) => {
                // Only a notifier that never joined at all: once the group
                // is running, rebalances after crashes and stalls take the
                // mock longer, and rejoining then would only restart them.
                let joined = self.consumer.context().joined.load(std::sync::atomic::Ordering::Relaxed);
                let never = ctx.stats.assigned.lock().map(|a| !a.contains_key(&self.index)).unwrap_or(false);
                if !ctx.static_membership && !joined && never && self.created.elapsed() > MOCK_JOIN_WAIT {
                    info!(notifier = %self.name, "no assignment from the mock cluster; joining again");
                    return Err(Ending::Again);
                }
                return Ok(None);
            }
            Ok(Err(e)) => {
                debug!(notifier = %self.name, cause = %e, "consumer error");
                return Ok(None);
            }
            Ok(Ok(m)) => incoming(&m),
        };
        let mut batch = vec![first];
        while batch.len() < ctx.scenario.notifier.batch_size {
            // What is already queued is taken without arming a timer.
            let next = match self.consumer.recv().now_or_never() {
                Some(r) => Ok(r),
                None => tokio::time::timeout(GATHER_WAIT, self.consumer.recv()).await,
            };
            match next {
                Ok(Ok(m)) => batch.push(incoming(&m)),
                _ => break,
            }
        }
        Ok(Some(batch))
    }

    /// The crash faults after the batch transaction: `notifier.mid_batch`
    /// struck inside it, or `notifier.before_offset_commit` after it (its
    /// probability is per event, every event reaches it, and one hit is
    /// enough). Either awaits the batch's redelivery to be confirmed.
    async fn crashes_after(&self, batch: &[Incoming], outcome: &BatchOutcome, held: Held) -> bool {
        let ctx = self.ctx;
        if outcome.crashed {
            ctx.faults.await_redelivery(FaultPoint::NotifierMidBatch, 1, held);
            return true;
        }
        ctx.stats.mark(&ctx.stats.first_apply_ms, &ctx.stats.last_apply_ms);
        Stats::add(&ctx.stats.events_applied, outcome.applied);
        Stats::add(&ctx.stats.duplicates_absorbed, outcome.duplicates);
        Stats::add(&ctx.stats.stale_ignored, outcome.stale);
        Stats::add(&ctx.stats.dead_lettered, outcome.dead_lettered);
        let mut fires = 0;
        for m in batch {
            fires += ctx.faults.strike(FaultPoint::NotifierBeforeOffsetCommit, self.name, || {
                format!("batch of {} events, partition {} offset {}", batch.len(), m.partition, m.offset)
            }) as u64;
        }
        if fires > 0 {
            ctx.faults.await_redelivery(FaultPoint::NotifierBeforeOffsetCommit, fires, held);
            // In a component process: stop here, the offsets uncommitted,
            // for the harness's SIGKILL.
            crate::component::halt_for(FaultPoint::NotifierBeforeOffsetCommit, fires).await;
        }
        fires > 0
    }

    /// A zombie: this incarnation freezes while holding the batch (a GC
    /// pause, a stopped VM). The group replaces it and the batch is
    /// delivered again; when the zombie wakes it still applies what it held.
    /// It never commits offsets: it has been fenced.
    fn zombie(&self, batch: Vec<Incoming>, modes: Modes, faults: BatchFaults, stall: Duration, held: Held) {
        let ctx = self.ctx;
        let store = ctx.store.clone();
        let (stats, who, injector) = (ctx.stats.clone(), self.name.to_string(), ctx.faults.clone());
        if faults.crash_mid_batch {
            // The zombie never commits offsets: its batch comes back.
            ctx.faults.await_redelivery(FaultPoint::NotifierMidBatch, 1, held);
        } else {
            ctx.faults.settled(held);
        }
        let zombie = ZombieGuard::new(&ctx.stats);
        ctx.tasks.spawn(format!("{} zombie", self.name), async move {
            let _zombie = zombie;
            let hold = BatchFaults { crash_mid_batch: faults.crash_mid_batch, stall: Some(stall) };
            match store.apply_batch(&batch, modes, hold).await {
                Ok(o) => Stats::add(&stats.events_applied, o.applied),
                Err(e) => warn!(notifier = %who, cause = %e, "zombie batch failed"),
            }
            // Woken past its stall, it made its late attempt.
            injector.confirm(FaultPoint::NotifierStall, 1);
        });
    }

    /// A late replay, as an operator's offset reset makes one: the group's
    /// committed offsets go back to the start of this batch's partitions and
    /// reading resumes there. No restart: the replay is of the data, not of
    /// the process.
    fn replay(&self, batch: &[Incoming], at: (i32, i64)) {
        let (ctx, consumer) = (self.ctx, &self.consumer);
        ctx.faults.await_next_delivery(FaultPoint::NotifierReplay, at);
        let rewind = rewind_offsets(&ctx.names.topic, batch);
        let _ = tokio::task::block_in_place(|| consumer.commit(&rewind, CommitMode::Sync));
        drop(rewind);
        let parts: std::collections::BTreeSet<i32> = batch.iter().map(|m| m.partition).collect();
        for p in parts {
            let sought =
                tokio::task::block_in_place(|| consumer.seek(&ctx.names.topic, p, Offset::Beginning, OFFSET_TIMEOUT));
            if let Err(e) = sought {
                debug!(notifier = %self.name, partition = p, cause = %e, "seek for the replay failed");
            }
        }
    }
}

/// The embedded mode's notifier crash. On a real broker a crash drops the
/// consumer and a new one takes its place in the group. librdkafka's mock
/// cluster needs about a second per rejoin (measured: 374 deliveries/s at
/// 0.2% crashes per event), so there the crash keeps the membership and
/// drops what a restart loses: every position not committed. Reading resumes
/// at the group's committed offsets, and what was processed since is
/// delivered again, as after a restart. Returns false when the consumer
/// could not be rewound (then the caller restarts it for real).
fn rewind_to_committed(consumer: &NotifierConsumer, topic: &str) -> bool {
    tokio::task::block_in_place(|| {
        let Ok(assignment) = consumer.assignment() else { return false };
        let Ok(committed) = consumer.committed_offsets(assignment, OFFSET_TIMEOUT) else { return false };
        let mut ok = true;
        for e in committed.elements_for_topic(topic) {
            let to = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ => Offset::Beginning,
            };
            ok &= consumer.seek(topic, e.partition(), to, OFFSET_TIMEOUT).is_ok();
        }
        ok
    })
}

/// Offset 0 for every partition of a batch: everything again.
fn rewind_offsets(topic: &str, batch: &[Incoming]) -> TopicPartitionList {
    let parts: std::collections::BTreeSet<i32> = batch.iter().map(|m| m.partition).collect();
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        let _ = tpl.add_partition_offset(topic, p, Offset::Offset(0));
    }
    tpl
}

/// The offsets to commit after a batch: one past the highest seen per partition.
fn next_offsets(topic: &str, batch: &[Incoming]) -> TopicPartitionList {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for m in batch {
        let e = next.entry(m.partition).or_insert(0);
        *e = (*e).max(m.offset + 1);
    }
    let mut tpl = TopicPartitionList::new();
    for (p, o) in next {
        let _ = tpl.add_partition_offset(topic, p, Offset::Offset(o));
    }
    tpl
}

/// The group's lag: for each partition, high watermark minus committed offset.
/// Returns the total. Every call is bounded by [`CONNECT_TIMEOUT`].
pub async fn group_lag(brokers: &str, group: &str, topic: &str, partitions: i32) -> Result<i64> {
    let (brokers, group, topic) = (brokers.to_string(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        // A consumer that never subscribes never joins the group; it only reads
        // the group's committed offsets.
        let c: BaseConsumer = kafka_config(&brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| Error::kafka("creating the lag probe", e))?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&topic, p);
        }
        let committed =
            c.committed_offsets(tpl, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading committed offsets", e))?;
        let mut lag = 0;
        for p in 0..partitions {
            let (_, high) =
                c.fetch_watermarks(&topic, p, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading watermarks", e))?;
            let done = match committed.find_partition(&topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            lag += (high - done).max(0);
        }
        Ok(lag)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
}
