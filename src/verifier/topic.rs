//! Reads the whole topic through the broker ([`crate::broker::Broker::read_topic`]):
//! no group, no commits, every partition from its low to its high watermark
//! as seen at the start.
//! The reader checks its own read: each partition must yield exactly high
//! minus low messages. Then the verifier checks it against what the read
//! did not use: the messages it counted itself, against the watermarks
//! fetched again after the read. A short (or long) read is an error, so the
//! run is incomplete, never passed or failed on a partial topic.

use crate::broker::{Broker, SharedBroker, Span};
use crate::domain::events::{self, Delivery, EventKind};
use crate::error::{Error, Result};
use crate::verifier::Ledger;
use std::time::Duration;
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
    /// Of its raw key, type header and payload ([`events::fingerprint`]).
    pub fingerprint: u32,
}

impl TopicRecord {
    /// The compact record of a message as received.
    pub fn of(m: &Delivery<'_>) -> Self {
        let uuid = |v: Option<&[u8]>| v.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| Uuid::parse_str(s).ok());
        let kind = events::decode(m.event_id, m.event_type, m.payload).ok().map(|d| d.kind);
        let fingerprint = events::fingerprint(
            m.key.unwrap_or_default(),
            m.event_type.unwrap_or_default(),
            m.payload.unwrap_or_default(),
        );
        Self {
            partition: m.partition,
            offset: m.offset,
            event_id: uuid(m.event_id),
            payment_id: uuid(m.key),
            kind,
            fingerprint,
        }
    }
}

/// Streams every message into the ledger, one compact record at a time, and
/// gives the ledger back. Gives up with an error, never hangs, if the topic
/// cannot be read to its end within `limit`.
pub async fn read_all(
    broker: SharedBroker,
    topic: &str,
    partitions: i32,
    limit: Duration,
    mut ledger: Ledger,
) -> Result<Ledger> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        read_checked(&*broker, &topic, partitions, limit, &mut |m| ledger.add_message(TopicRecord::of(&m)))?;
        Ok(ledger)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
}

/// Hands every message of the topic to `sink`, then checks the read twice:
/// the reader's own account, and the messages counted here against the
/// watermarks fetched again, now that nothing writes. Every verifier reads
/// the topic through this, so none of them judges a partial topic.
/// Blocking.
pub fn read_checked(
    broker: &dyn Broker,
    topic: &str,
    partitions: i32,
    limit: Duration,
    sink: &mut dyn FnMut(Delivery<'_>),
) -> Result<()> {
    // Counted here, per partition, as the messages are handed over.
    let mut received = vec![0i64; partitions.max(0) as usize];
    let spans = broker.read_topic(topic, partitions, limit, &mut |m| {
        if let Some(n) = received.get_mut(m.partition as usize) {
            *n += 1;
        }
        sink(m)
    })?;
    check_read(topic, &spans)?;
    // Against a source the read did not use.
    let again = broker.watermarks(topic, partitions)?;
    check_against(topic, &again, &received)
}

/// The reader's check of its own read: each partition gave exactly the
/// messages between its watermarks, no fewer (a skipped partition, a
/// reader that stops early) and no more.
fn check_read(topic: &str, spans: &[Span]) -> Result<()> {
    for (p, Span { low, high, read: n }) in spans.iter().enumerate() {
        let want = high - low;
        if *n != want {
            return Err(Error::Kafka {
                context: format!("checking the read of topic {topic}"),
                cause: format!(
                    "partition {p} gave {n} messages between its watermarks {low}..{high}, which hold {want}"
                ),
            });
        }
    }
    Ok(())
}

/// The read checked against what it did not use: each partition handed
/// over exactly the messages its watermarks, fetched again after the read,
/// hold. A reader that stops early, and reports the place it stopped as
/// the end, passes its own check and fails this one.
fn check_against(topic: &str, watermarks: &[(i64, i64)], received: &[i64]) -> Result<()> {
    for (p, ((low, high), n)) in watermarks.iter().zip(received).enumerate() {
        if *n != high - low {
            return Err(Error::Kafka {
                context: format!("checking the read of topic {topic} against its watermarks"),
                cause: format!(
                    "partition {p} handed over {n} messages; its watermarks, fetched again after the read, hold {} ({low}..{high})",
                    high - low
                ),
            });
        }
    }
    if watermarks.len() != received.len() {
        return Err(Error::Kafka {
            context: format!("checking the read of topic {topic} against its watermarks"),
            cause: format!("{} partitions read, {} with watermarks", received.len(), watermarks.len()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_long_read_is_an_error_naming_the_partition() {
        let spans = |read: [i64; 3]| -> Vec<Span> {
            [(0, 3), (4, 4), (10, 15)]
                .iter()
                .zip(read)
                .map(|((low, high), read)| Span { low: *low, high: *high, read })
                .collect()
        };
        assert!(check_read("t", &spans([3, 0, 5])).is_ok());
        let short = check_read("t", &spans([3, 0, 4])).unwrap_err().to_string();
        assert!(short.contains("partition 2 gave 4 messages between its watermarks 10..15, which hold 5"), "{short}");
        assert!(check_read("t", &spans([4, 0, 5])).is_err(), "more than the watermarks hold");
    }

    #[test]
    fn a_read_that_stops_early_is_caught_by_the_watermarks_fetched_again() {
        let again = [(0, 3), (4, 4), (10, 15)];
        assert!(check_against("t", &again, &[3, 0, 5]).is_ok());
        // The reader stopped one short on partition 2 and said so in its own spans.
        let early = check_against("t", &again, &[3, 0, 4]).unwrap_err().to_string();
        assert!(early.contains("partition 2 handed over 4 messages"), "{early}");
        assert!(check_against("t", &again, &[3, 0]).is_err(), "a partition not read at all");
    }
}
