//! Reads the whole topic with a consumer of its own: no group, no commits,
//! every partition from the beginning to the high watermark seen at the start.

use crate::error::{Error, Result};
use crate::events::{self, EventKind};
use crate::infra::{kafka_config, CONNECT_TIMEOUT};
use crate::verifier::Ledger;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// One message on the topic as read, before the ledger compacts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    pub partition: i32,
    pub offset: i64,
    /// The producer's event id from the header; None when missing or unreadable.
    pub event_id: Option<Uuid>,
    /// The payment id (the key); None when unreadable.
    pub payment_id: Option<Uuid>,
    /// None for a message that does not decode (poison).
    pub kind: Option<EventKind>,
}

/// Streams every message into the ledger, one compact record at a time, and
/// gives the ledger back. Gives up with an error, never hangs, if the topic
/// cannot be read to its end within `limit`.
pub async fn read_all(
    brokers: &str,
    topic: &str,
    partitions: i32,
    limit: Duration,
    mut ledger: Ledger,
) -> Result<Ledger> {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        read_blocking(&brokers, &topic, partitions, limit, |m| ledger.add_message(m))?;
        Ok(ledger)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
}

fn read_blocking(
    brokers: &str,
    topic: &str,
    partitions: i32,
    limit: Duration,
    mut sink: impl FnMut(TopicRecord),
) -> Result<()> {
    let c: BaseConsumer = kafka_config(brokers)
        .set("group.id", format!("{topic}.verifier"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("queued.max.messages.kbytes", "16384")
        .create()
        .map_err(|e| Error::kafka("creating the verifier's reader", e))?;
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) =
            c.fetch_watermarks(topic, p, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading watermarks", e))?;
        ends.push(high);
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| Error::kafka("assigning", e))?;
        }
    }
    c.assign(&tpl).map_err(|e| Error::kafka("assigning the topic", e))?;
    let total: i64 = ends.iter().sum();
    let mut read = 0u64;
    let mut next: Vec<i64> = vec![0; partitions as usize];
    let done = |next: &Vec<i64>| next.iter().zip(&ends).all(|(n, e)| n >= e);
    let started = Instant::now();
    while !done(&next) {
        if started.elapsed() > limit {
            return Err(Error::Kafka {
                context: format!("reading topic {topic} to its end"),
                cause: format!("read {read} of {total} messages in {}s", limit.as_secs()),
            });
        }
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.map_err(|e| Error::kafka("reading the topic", e))?;
        let p = m.partition() as usize;
        if m.offset() >= ends[p] {
            continue;
        }
        next[p] = next[p].max(m.offset() + 1);
        let mut id = None;
        let mut ty = None;
        if let Some(h) = m.headers() {
            for header in h.iter() {
                match header.key {
                    events::HEADER_EVENT_ID => id = header.value,
                    events::HEADER_EVENT_TYPE => ty = header.value,
                    _ => {}
                }
            }
        }
        let event_id = id.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| Uuid::parse_str(s).ok());
        let payment_id = m.key().and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| Uuid::parse_str(s).ok());
        let kind = events::decode(id, ty, m.payload()).ok().map(|d| d.kind);
        read += 1;
        sink(TopicRecord { partition: m.partition(), offset: m.offset(), event_id, payment_id, kind });
    }
    drop(c);
    Ok(())
}
