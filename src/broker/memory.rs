//! An in-memory broker with the semantics the pipeline's correctness rests
//! on, and nothing else: partitions that only grow, a consumer group whose
//! committed offsets are where a new member starts, a rebalance whenever a
//! member joins or goes (every member then restarts from the committed
//! offsets, as in Kafka's eager rebalance), and commits refused from a
//! member that is no longer in the group. It lets the relay's and the
//! notifier's crash semantics be unit-tested without a Kafka.
//!
//! What it leaves out: replication, acks that can be lost, transactions,
//! timing. A test on it says what the code does with the semantics; the
//! end-to-end tests on Kafka say the semantics are Kafka's.

use super::{Broker, Consumer, ConsumerSpec, GroupState, Producer, Span, Topic};
use crate::broker::Delivery;
use crate::domain::events::Envelope;
use crate::error::{Error, Result};
use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a waiting consumer looks for new messages.
const POLL: Duration = Duration::from_millis(1);

/// One message as stored.
#[derive(Debug, Clone)]
struct Stored {
    key: Vec<u8>,
    event_id: Vec<u8>,
    event_type: Vec<u8>,
    payload: Vec<u8>,
}

impl Stored {
    fn delivery(&self, partition: i32, offset: i64) -> Delivery<'_> {
        Delivery {
            position: crate::broker::Position::new(partition, offset),
            key: Some(&self.key),
            event_id: Some(&self.event_id),
            event_type: Some(&self.event_type),
            payload: Some(&self.payload),
        }
    }
}

#[derive(Debug, Default)]
struct Group {
    committed: BTreeMap<i32, i64>,
    /// Members in the order they joined; partition p goes to member p mod n.
    members: Vec<u64>,
    /// Grows at every join and leave: a member that sees it change has
    /// been through a rebalance.
    generation: u64,
}

#[derive(Debug, Default)]
struct State {
    topics: HashMap<String, Vec<Vec<Stored>>>,
    groups: HashMap<String, Group>,
    next_member: u64,
}

/// The in-memory broker. Cheap to clone; clones share the messages.
#[derive(Debug, Clone, Default)]
pub struct Memory(Arc<Mutex<State>>);

impl Memory {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every message of a partition, for tests: (event id, key) as text.
    pub fn messages(&self, topic: &str, partition: i32) -> Vec<(String, String)> {
        let s = self.state();
        let Some(parts) = s.topics.get(topic) else { return Vec::new() };
        parts.get(partition as usize).into_iter().flatten().map(|m| (text(&m.event_id), text(&m.key))).collect()
    }

    /// The group's committed offset of a partition, for tests.
    pub fn committed(&self, group: &str, partition: i32) -> Option<i64> {
        self.state().groups.get(group).and_then(|g| g.committed.get(&partition).copied())
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The partition of a key: FNV-1a, so the same payment always lands on the
/// same partition, as with Kafka's default partitioner.
fn partition_of(key: &[u8], partitions: usize) -> usize {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3));
    (h % partitions as u64) as usize
}

fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

impl Broker for Memory {
    fn kind(&self) -> &'static str {
        "in-memory"
    }

    fn bootstrap(&self) -> &str {
        ""
    }

    fn embedded(&self) -> bool {
        false
    }

    fn create_topic<'a>(&'a self, topic: &'a Topic) -> BoxFuture<'a, Result<()>> {
        let mut s = self.state();
        s.topics.entry(topic.name.clone()).or_insert_with(|| vec![Vec::new(); topic.lanes.max(1) as usize]);
        ready(Ok(()))
    }

    fn producer(&self) -> Result<Box<dyn Producer>> {
        Ok(Box::new(self.clone()))
    }

    fn consumer(&self, spec: ConsumerSpec) -> Result<Box<dyn Consumer>> {
        let id = {
            let mut s = self.state();
            s.next_member += 1;
            s.next_member
        };
        Ok(Box::new(MemoryConsumer {
            broker: self.clone(),
            spec,
            id,
            read: Mutex::new(Positions { generation: 0, next: BTreeMap::new() }),
        }))
    }

    fn watermarks(&self, topic: &Topic) -> Result<Vec<(i64, i64)>> {
        let s = self.state();
        let parts = s.topics.get(&topic.name).ok_or_else(|| unknown(&topic.name))?;
        Ok((0..topic.lanes as usize).map(|p| (0, parts.get(p).map_or(0, |v| v.len() as i64))).collect())
    }

    fn taken(&self, group: &str, _topic: &Topic) -> Result<Option<i64>> {
        let s = self.state();
        let committed = s.groups.get(group).map(|g| &g.committed).filter(|c| !c.is_empty());
        Ok(committed.map(|c| c.values().sum()))
    }

    fn backlog<'a>(&'a self, group: &'a str, topic: &'a Topic) -> BoxFuture<'a, Result<i64>> {
        let marks = match self.watermarks(topic) {
            Ok(m) => m,
            Err(e) => return ready(Err(e)),
        };
        let s = self.state();
        let committed = |p: usize| s.groups.get(group).and_then(|g| g.committed.get(&(p as i32)).copied()).unwrap_or(0);
        ready(Ok(marks.iter().enumerate().map(|(p, (_, high))| (high - committed(p)).max(0)).sum()))
    }

    fn group<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<Option<GroupState>>> {
        // No rebalance here: a member is assigned as it joins.
        let members = self.state().groups.get(group).map_or(0, |g| g.members.len());
        ready(Ok(Some(GroupState { members, settled: true })))
    }

    fn read_topic(&self, topic: &Topic, _limit: Duration, sink: &mut dyn FnMut(Delivery<'_>)) -> Result<Vec<Span>> {
        let s = self.state();
        let parts = s.topics.get(&topic.name).ok_or_else(|| unknown(&topic.name))?;
        let mut spans = Vec::new();
        for p in 0..topic.lanes as usize {
            let msgs = parts.get(p).map(Vec::as_slice).unwrap_or_default();
            for (o, m) in msgs.iter().enumerate() {
                sink(m.delivery(p as i32, o as i64));
            }
            spans.push(Span { low: 0, high: msgs.len() as i64, read: msgs.len() as i64, skipped: 0 });
        }
        Ok(spans)
    }

    fn list_names(&self) -> BoxFuture<'_, Result<(Vec<String>, Vec<String>)>> {
        let s = self.state();
        ready(Ok((s.topics.keys().cloned().collect(), s.groups.keys().cloned().collect())))
    }

    fn delete_names<'a>(&'a self, topics: &'a [String], groups: &'a [String]) -> BoxFuture<'a, Result<()>> {
        let mut s = self.state();
        topics.iter().for_each(|t| drop(s.topics.remove(t)));
        groups.iter().for_each(|g| drop(s.groups.remove(g)));
        ready(Ok(()))
    }
}

fn unknown(topic: &str) -> Error {
    Error::Kafka { context: format!("reading topic {topic}"), cause: "no such topic".into() }
}

impl Producer for Memory {
    /// Appends every message; one addressed to a partition the topic lacks
    /// fails, after the others are stored, as a refused produce does.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        batch: &'a [Envelope<'a>],
        await_acks: bool,
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        let mut s = self.state();
        let Some(parts) = s.topics.get_mut(topic) else { return ready(Err(format!("unknown topic {topic}"))) };
        let mut failed = None;
        for e in batch {
            let p = match e.lane {
                Some(p) if p < 0 || p as usize >= parts.len() => {
                    failed.get_or_insert(format!("unknown partition {p} of topic {topic}"));
                    continue;
                }
                Some(p) => p as usize,
                None => partition_of(e.key.as_bytes(), parts.len()),
            };
            parts[p].push(Stored {
                key: e.key.as_bytes().to_vec(),
                event_id: e.event_id.as_bytes().to_vec(),
                event_type: e.event_type.as_bytes().to_vec(),
                payload: e.payload.to_vec(),
            });
        }
        ready(match failed {
            Some(e) if await_acks => Err(e),
            _ => Ok(()),
        })
    }
}

/// Where a member reads, as of the group generation it last saw.
struct Positions {
    generation: u64,
    next: BTreeMap<i32, i64>,
}

struct MemoryConsumer {
    broker: Memory,
    spec: ConsumerSpec,
    id: u64,
    read: Mutex<Positions>,
}

impl MemoryConsumer {
    /// Hands on what is there for this member, up to `max`; 0 when nothing.
    fn take(&self, max: usize, each: &mut (dyn FnMut(Delivery<'_>) + Send)) -> usize {
        let s = self.broker.state();
        let (Some(g), Some(parts)) = (s.groups.get(&self.spec.group), s.topics.get(&self.spec.topic)) else {
            return 0;
        };
        let Some(me) = g.members.iter().position(|m| *m == self.id) else { return 0 };
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if read.generation != g.generation {
            // A rebalance: every position not committed is forgotten.
            let mine: Vec<i32> = (0..parts.len() as i32).filter(|p| *p as usize % g.members.len() == me).collect();
            read.next = mine.iter().map(|p| (*p, g.committed.get(p).copied().unwrap_or(0))).collect();
            read.generation = g.generation;
            (self.spec.on_assign)(mine.len());
        }
        let mut n = 0;
        for (p, next) in read.next.iter_mut() {
            while n < max {
                let Some(m) = parts[*p as usize].get(*next as usize) else { break };
                each(m.delivery(*p, *next));
                *next += 1;
                n += 1;
            }
        }
        n
    }
}

impl Consumer for MemoryConsumer {
    fn join(&self) -> Result<()> {
        let mut s = self.broker.state();
        let g = s.groups.entry(self.spec.group.clone()).or_default();
        g.members.push(self.id);
        g.generation += 1;
        Ok(())
    }

    fn poll_batch<'a>(
        &'a self,
        max: usize,
        first: Duration,
        _gather: Duration,
        each: &'a mut (dyn FnMut(Delivery<'_>) + Send),
    ) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            let deadline = Instant::now() + first;
            loop {
                let n = self.take(max, each);
                if n > 0 || Instant::now() >= deadline {
                    return n;
                }
                tokio::time::sleep(POLL).await;
            }
        })
    }

    /// Refused from a member that has left the group or missed a
    /// rebalance, as Kafka fences a stale generation.
    fn commit(&self, next: &[crate::broker::Position], _wait: bool) -> std::result::Result<(), String> {
        let mut s = self.broker.state();
        let g = s.groups.entry(self.spec.group.clone()).or_default();
        let generation = self.read.lock().unwrap_or_else(|p| p.into_inner()).generation;
        if !g.members.contains(&self.id) || generation != g.generation {
            return Err("the member is not in the group's current generation".into());
        }
        for p in next {
            g.committed.insert(p.lane(), p.at());
        }
        Ok(())
    }

    fn replay_from_start(&self, partitions: &[i32]) {
        let mut s = self.broker.state();
        let g = s.groups.entry(self.spec.group.clone()).or_default();
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        for p in partitions {
            g.committed.insert(*p, 0);
            if let Some(next) = read.next.get_mut(p) {
                *next = 0;
            }
        }
    }
}

impl Drop for MemoryConsumer {
    /// The member goes: its uncommitted reads are delivered again to
    /// whoever holds its partitions next.
    fn drop(&mut self) {
        let mut s = self.broker.state();
        if let Some(g) = s.groups.get_mut(&self.spec.group) {
            if let Some(i) = g.members.iter().position(|m| *m == self.id) {
                g.members.remove(i);
                g.generation += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(member: &str) -> ConsumerSpec {
        ConsumerSpec {
            group: "g".into(),
            topic: "t".into(),
            member: member.into(),
            session: Duration::from_secs(1),
            on_assign: Arc::new(|_| {}),
        }
    }

    async fn publish(b: &Memory, n: usize) {
        let ids: Vec<uuid::Uuid> = (0..n).map(|_| uuid::Uuid::new_v4()).collect();
        let batch: Vec<Envelope> = ids.iter().map(|i| Envelope::new(*i, *i, "payment.captured", b"{}")).collect();
        b.publish("t", &batch, true).await.unwrap();
    }

    async fn offsets(c: &dyn Consumer) -> Vec<(i32, i64)> {
        let mut got = Vec::new();
        c.poll_batch(1000, Duration::from_millis(20), Duration::ZERO, &mut |d| {
            got.push((d.position.lane(), d.position.at()))
        })
        .await;
        got
    }

    #[tokio::test]
    async fn what_a_member_did_not_commit_comes_back_to_the_next() {
        let b = Memory::new();
        b.create_topic(&Topic::new("t", 2)).await.unwrap();
        publish(&b, 10).await;
        let first = b.consumer(spec("a")).unwrap();
        first.join().unwrap();
        let got = offsets(first.as_ref()).await;
        assert_eq!(got.len(), 10, "one member holds both partitions");
        // It commits partition 0 only, then vanishes.
        let p0 = got.iter().filter(|(p, _)| *p == 0).count() as i64;
        first.commit(&[(0, p0).into()], true).unwrap();
        drop(first);
        assert_eq!(b.committed("g", 0), Some(p0));
        assert_eq!(b.committed("g", 1), None, "partition 1 was never committed");
        assert_eq!(b.backlog("g", &Topic::new("t", 2)).await.unwrap(), 10 - p0);
        let second = b.consumer(spec("a")).unwrap();
        second.join().unwrap();
        let again = offsets(second.as_ref()).await;
        assert_eq!(again.len() as i64, 10 - p0, "partition 1 again, partition 0 not");
        assert!(again.iter().all(|(p, _)| *p == 1));
    }

    #[tokio::test]
    async fn a_rebalance_splits_the_partitions_and_fences_the_old_generation() {
        let b = Memory::new();
        b.create_topic(&Topic::new("t", 2)).await.unwrap();
        publish(&b, 20).await;
        let a = b.consumer(spec("a")).unwrap();
        a.join().unwrap();
        assert_eq!(offsets(a.as_ref()).await.len(), 20);
        let c = b.consumer(spec("c")).unwrap();
        c.join().unwrap();
        // `a` has not seen the rebalance yet: its commit is refused.
        assert!(a.commit(&[(0, 5).into()], true).is_err());
        let (got_a, got_c) = (offsets(a.as_ref()).await, offsets(c.as_ref()).await);
        assert!(got_a.iter().all(|(p, _)| *p == 0) && got_c.iter().all(|(p, _)| *p == 1));
        assert_eq!(got_a.len() + got_c.len(), 20, "both restart from the committed offsets (none)");
        assert_eq!(b.group("g").await.unwrap().map(|g| g.members), Some(2));
    }

    #[tokio::test]
    async fn a_refused_partition_fails_the_publish_and_keeps_the_rest() {
        let b = Memory::new();
        b.create_topic(&Topic::new("t", 1)).await.unwrap();
        let id = uuid::Uuid::new_v4();
        let mut bad = Envelope::new(id, id, "payment.captured", b"{}");
        bad.lane = Some(1);
        let batch = [Envelope::new(id, id, "payment.captured", b"{}"), bad];
        assert!(b.publish("t", &batch, true).await.unwrap_err().contains("unknown partition 1"));
        assert_eq!(b.messages("t", 0).len(), 1);
        assert!(b.publish("t", &batch, false).await.is_ok(), "fire and forget never hears of it");
    }
}
