//! The notifier's consumer on Kafka, and the mock cluster's quirks for it.

use super::{config, delivery};
use crate::broker::Delivery;
use crate::broker::{ConsumerSpec, OffRuntime, OnAssign, Replace};
use crate::domain::names::CONNECT_TIMEOUT;
use crate::error::{Error, Result};
use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// How long a consumer on the mock cluster may go without completing its
/// join before it is replaced: the mock sometimes leaves one member of a
/// new group unjoined for good (measured: about 1 run in 5 of
/// payments.toml, one of two notifiers had no assignment after 5 s), while
/// joins that complete do so in about 1.1 s.
///
/// The wait doubles each time the same member is replaced so, up to
/// [`MOCK_JOIN_WAIT_MAX`]: each replacement is a leave and a join, so a new
/// rebalance, and when notifiers are processes that restart at every crash
/// a fixed 2 s wait replaced every new member before its first rebalance
/// had completed, over and over (measured: a notifier process replaced its
/// consumer every 2 s for 80 s, and the run did not drain).
pub const MOCK_JOIN_WAIT: Duration = Duration::from_secs(2);
const MOCK_JOIN_WAIT_MAX: Duration = Duration::from_secs(16);

/// One notifier member's history on the mock cluster, across its
/// consumers: how many times in a row it was replaced for want of an
/// assignment (0 again once it gets one), and whether any of them ever
/// saw a rebalance.
#[derive(Default)]
pub struct Stranding {
    replaced: AtomicU32,
    rebalanced: AtomicBool,
}

pub type Strandings = std::sync::Arc<Stranding>;

/// How long a seek or a committed-offsets read may take: each asks the group
/// coordinator once, which answers in milliseconds when it is there at all.
const OFFSET_TIMEOUT: Duration = Duration::from_secs(5);

/// The consumer's context: it reports each rebalance's outcome, so the run
/// can wait for the group to hold every partition before the workload
/// starts (a real service's consumers are up before its traffic).
pub struct Membership {
    on_assign: OnAssign,
    member: String,
    strandings: Option<Strandings>,
}

impl ClientContext for Membership {}

impl ConsumerContext for Membership {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let held = match rebalance {
            Rebalance::Assign(tpl) => tpl.count(),
            _ => 0,
        };
        debug!(member = %self.member, partitions = held, "rebalance");
        if let Some(s) = &self.strandings {
            s.rebalanced.store(true, Ordering::Relaxed);
            if matches!(rebalance, Rebalance::Assign(_)) {
                s.replaced.store(0, Ordering::Relaxed);
            }
        }
        (self.on_assign)(held);
    }
}

/// A member of the notifiers' group. Dropped off the async threads: its
/// drop blocks until the client is closed.
pub struct KafkaConsumer {
    inner: OffRuntime<StreamConsumer<Membership>>,
    topic: String,
    /// On the mock cluster: how often this member was replaced unjoined,
    /// and how long it first waits to be joined.
    strandings: Option<(Strandings, Duration)>,
    /// When it joined (subscribed), for the mock cluster's unjoined
    /// members: a spare made long before counts from its join.
    joined_at: OnceLock<Instant>,
}

impl KafkaConsumer {
    /// `strandings` is Some on the mock cluster only, with the first wait
    /// for a join before the member is replaced.
    pub fn new(brokers: &str, strandings: Option<(Strandings, Duration)>, spec: ConsumerSpec) -> Result<Self> {
        let embedded = strandings.is_some();
        let session = spec.session.as_millis() as u64;
        let mut c = config(brokers);
        // librdkafka prefetches up to 64 MB per consumer by default. A
        // micro-batch of 200 events is about 140 KB, so 1 MB still holds several.
        // Measured on the bench scenario at 300,000 payments: peak RSS 381 MB
        // with 8 MB, 183 MB with 1 MB. Real Kafka takes less (below).
        let mut prefetch_kb = 1024;
        if !embedded {
            // Static membership: a restarted notifier takes its
            // predecessor's place without waiting out a session timeout. The
            // mock cluster does not shorten a static member's return, so
            // there members leave the group on close instead.
            c.set("group.instance.id", format!("{}.{}", spec.group, spec.member));
            // A fetch answers once 64 KB are there or 50 ms have passed, not at
            // the first byte: fewer, fuller fetches for the broker to serve.
            // Measured on the bench scenario, three interleaved pairs: 20,419 /
            // 22,056 / 21,959 events/s against 19,459 / 21,846 / 19,497 at one
            // byte, and 0.3 s less broker CPU per run. Not on the mock cluster,
            // whose fetch waits were not measured.
            c.set("fetch.min.bytes", "65536");
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
        let inner = c
            .set("group.id", &spec.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", session.to_string())
            // Members learn of a rebalance on their next heartbeat; a short one
            // keeps a crashed member's return from stalling the others.
            .set("heartbeat.interval.ms", (session / 3).clamp(100, 250).to_string())
            .set("max.poll.interval.ms", (session * 5).max(30_000).to_string())
            .set("fetch.wait.max.ms", "50")
            .set("queued.max.messages.kbytes", prefetch_kb.to_string())
            .create_with_context(Membership {
                on_assign: spec.on_assign,
                member: spec.member,
                strandings: strandings.as_ref().map(|s| s.0.clone()),
            })
            .map_err(|e| Error::kafka("creating a notifier consumer", e))?;
        Ok(Self { inner: OffRuntime::new(inner), topic: spec.topic, strandings, joined_at: OnceLock::new() })
    }

    fn c(&self) -> &StreamConsumer<Membership> {
        &self.inner
    }

    /// A partition list of `topic`, one offset per partition.
    fn offsets(&self, at: impl IntoIterator<Item = (i32, i64)>) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in at {
            let _ = tpl.add_partition_offset(&self.topic, p, Offset::Offset(o));
        }
        tpl
    }
}

impl crate::broker::Consumer for KafkaConsumer {
    fn join(&self) -> Result<()> {
        let _ = self.joined_at.set(Instant::now());
        self.c().subscribe(&[&self.topic]).map_err(|e| Error::kafka("subscribing the notifier", e))
    }

    /// Connected to the broker, the group coordinator found and the topic's
    /// metadata read: subscribing then joins at once. A crash still costs
    /// a new member joining the group, fetching the committed offsets and
    /// reading from them; it no longer waits for three connections and a
    /// metadata request first.
    fn warm(&self) {
        let _ = self.c().fetch_metadata(Some(&self.topic), CONNECT_TIMEOUT);
    }

    fn poll_batch<'a>(
        &'a self,
        max: usize,
        first: Duration,
        gather: Duration,
        each: &'a mut (dyn FnMut(Delivery<'_>) + Send),
    ) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            let c = self.c();
            match tokio::time::timeout(first, c.recv()).await {
                Err(_) => return 0,
                Ok(Err(e)) => {
                    info!(topic = %self.topic, cause = %e, "consumer error");
                    return 0;
                }
                Ok(Ok(m)) => each(delivery(&m)),
            }
            let mut n = 1;
            while n < max {
                // What is already queued is taken without arming a timer.
                let next = match c.recv().now_or_never() {
                    Some(r) => Ok(r),
                    None => tokio::time::timeout(gather, c.recv()).await,
                };
                match next {
                    Ok(Ok(m)) => each(delivery(&m)),
                    _ => break,
                }
                n += 1;
            }
            n
        })
    }

    fn commit(&self, next: &[crate::broker::Position], wait: bool) -> std::result::Result<(), String> {
        // Partition lists can hold references into the client: this one is
        // released before the call returns, or the consumer's destruction
        // would wait for it.
        let tpl = self.offsets(next.iter().map(|p| (p.lane(), p.at())));
        let r = if wait {
            tokio::task::block_in_place(|| self.c().commit(&tpl, CommitMode::Sync))
        } else {
            self.c().commit(&tpl, CommitMode::Async)
        };
        drop(tpl);
        r.map_err(|e| e.to_string())
    }

    fn replay_from_start(&self, partitions: &[i32]) {
        let c = self.c();
        let rewind = self.offsets(partitions.iter().map(|p| (*p, 0)));
        let _ = tokio::task::block_in_place(|| c.commit(&rewind, CommitMode::Sync));
        drop(rewind);
        for p in partitions {
            let sought = tokio::task::block_in_place(|| c.seek(&self.topic, *p, Offset::Beginning, OFFSET_TIMEOUT));
            if let Err(e) = sought {
                debug!(partition = p, cause = %e, "seek for the replay failed");
            }
        }
    }

    /// Only on the mock cluster, which needs about a second per rejoin
    /// (measured: 374 deliveries/s at 0.2% crashes per event): every
    /// position not committed is dropped; reading resumes at the group's
    /// committed offsets, and what was processed since is delivered again,
    /// as after a restart. A real broker's member is replaced instead.
    fn crash_in_place(&self) -> bool {
        if self.strandings.is_none() {
            return false;
        }
        let c = self.c();
        tokio::task::block_in_place(|| {
            let Ok(assignment) = c.assignment() else { return false };
            let Ok(committed) = c.committed_offsets(assignment, OFFSET_TIMEOUT) else { return false };
            let mut ok = true;
            for e in committed.elements_for_topic(&self.topic) {
                let to = match e.offset() {
                    Offset::Offset(o) => Offset::Offset(o),
                    _ => Offset::Beginning,
                };
                ok &= c.seek(&self.topic, e.partition(), to, OFFSET_TIMEOUT).is_ok();
            }
            ok
        })
    }

    /// A fatal error first. Then, on the mock cluster, a member unjoined
    /// past its wait, of a notifier none of whose members ever saw a
    /// rebalance: once the group is running, rebalances after crashes and
    /// stalls take the mock longer, and replacing members then would only
    /// restart them.
    fn replace(&self) -> Option<Replace> {
        if let Some((code, why)) = self.c().client().fatal_error() {
            return Some(Replace::Failed(format!("{code:?}: {why}")));
        }
        let (s, first) = self.strandings.as_ref()?;
        let wait = (*first * 2u32.pow(s.replaced.load(Ordering::Relaxed).min(3))).min(MOCK_JOIN_WAIT_MAX);
        let waited = self.joined_at.get().is_some_and(|at| at.elapsed() > wait);
        if s.rebalanced.load(Ordering::Relaxed) || !waited {
            return None;
        }
        s.replaced.fetch_add(1, Ordering::Relaxed);
        Some(Replace::Unjoined)
    }
}
