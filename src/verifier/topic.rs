//! Reads the whole topic with a consumer of its own: no group, no commits,
//! every partition from its low to its high watermark as seen at the start.
//! The reader checks its own read: each partition must yield exactly high
//! minus low messages. A short (or long) read is an error, so the run is
//! incomplete, never passed or failed on a partial topic.

use crate::error::{Error, Result};
use crate::events::{self, EventKind};
use crate::infra::{kafka_config, CONNECT_TIMEOUT};
use crate::verifier::Ledger;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long one poll of the reader waits before it checks its time limit.
const POLL: Duration = Duration::from_millis(200);

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
    /// Of its raw key, type header and payload ([`events::fingerprint`]).
    pub fingerprint: u32,
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
    let mut lows = Vec::new();
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) =
            c.fetch_watermarks(topic, p, CONNECT_TIMEOUT).map_err(|e| Error::kafka("reading watermarks", e))?;
        lows.push(low);
        ends.push(high);
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low)).map_err(|e| Error::kafka("assigning", e))?;
        }
    }
    c.assign(&tpl).map_err(|e| Error::kafka("assigning the topic", e))?;
    let total: i64 = ends.iter().zip(&lows).map(|(h, l)| h - l).sum();
    let mut read = 0u64;
    let mut per_partition: Vec<i64> = vec![0; partitions as usize];
    let mut next: Vec<i64> = lows.clone();
    let done = |next: &Vec<i64>| next.iter().zip(&ends).all(|(n, e)| n >= e);
    let started = Instant::now();
    while !done(&next) {
        if started.elapsed() > limit {
            return Err(Error::Kafka {
                context: format!("reading topic {topic} to its end"),
                cause: format!("read {read} of {total} messages in {}s", limit.as_secs()),
            });
        }
        let Some(m) = c.poll(POLL) else {
            continue;
        };
        let m = m.map_err(|e| Error::kafka("reading the topic", e))?;
        let p = m.partition() as usize;
        if p >= ends.len() || m.offset() >= ends[p] || m.offset() < next[p] {
            continue;
        }
        next[p] = m.offset() + 1;
        per_partition[p] += 1;
        let header = events::Header::of(&m);
        let event_id = header.event_id.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| Uuid::parse_str(s).ok());
        let payment_id = m.key().and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| Uuid::parse_str(s).ok());
        let kind = events::decode(header.event_id, header.event_type, m.payload()).ok().map(|d| d.kind);
        let fingerprint = events::fingerprint(
            m.key().unwrap_or_default(),
            header.event_type.unwrap_or_default(),
            m.payload().unwrap_or_default(),
        );
        read += 1;
        sink(TopicRecord { partition: m.partition(), offset: m.offset(), event_id, payment_id, kind, fingerprint });
    }
    check_read(topic, &per_partition, &lows, &ends)?;
    drop(c);
    Ok(())
}

/// The reader's check of its own read: each partition gave exactly the
/// messages between its watermarks, no fewer (a skipped partition, a
/// reader that stops early) and no more.
fn check_read(topic: &str, read: &[i64], lows: &[i64], highs: &[i64]) -> Result<()> {
    for (p, n) in read.iter().enumerate() {
        let want = highs[p] - lows[p];
        if *n != want {
            return Err(Error::Kafka {
                context: format!("checking the read of topic {topic}"),
                cause: format!(
                    "partition {p} gave {n} messages between its watermarks {}..{}, which hold {want}",
                    lows[p], highs[p]
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_long_read_is_an_error_naming_the_partition() {
        assert!(check_read("t", &[3, 0, 5], &[0, 4, 10], &[3, 4, 15]).is_ok());
        let short = check_read("t", &[3, 0, 4], &[0, 4, 10], &[3, 4, 15]).unwrap_err().to_string();
        assert!(short.contains("partition 2 gave 4 messages between its watermarks 10..15, which hold 5"), "{short}");
        assert!(check_read("t", &[4, 0, 5], &[0, 4, 10], &[3, 4, 15]).is_err(), "more than the watermarks hold");
    }
}
