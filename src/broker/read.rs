//! The verifier's read of a whole topic, as one broker operation: every
//! partition from its low to its high watermark as seen at the start, no
//! group, no commits. The reader checks its own read: each partition must
//! yield exactly high minus low messages. Then the read is checked against
//! what it did not use: the messages counted here, against the watermarks
//! fetched again after the read.

use crate::broker::{Broker, Delivery, Span, Topic};
use crate::error::{Error, Result};
use std::time::Duration;

/// Hands every message of the topic to `sink`, then checks the read twice:
/// the reader's own account, and the messages counted here against the
/// watermarks fetched again, now that nothing writes: "read everything,
/// and check the read against another source". Every verifier reads the
/// topic through this, so none of them judges a partial topic.
/// Blocking.
pub fn read_checked(
    broker: &dyn Broker,
    topic: &Topic,
    limit: Duration,
    sink: &mut dyn FnMut(Delivery<'_>),
) -> Result<()> {
    // Counted here, per partition, as the messages are handed over.
    let mut received = vec![0i64; topic.lanes.max(0) as usize];
    let spans = broker.read_topic(topic, limit, &mut |m| {
        if let Some(n) = received.get_mut(m.position.lane() as usize) {
            *n += 1;
        }
        sink(m)
    })?;
    check_read(&topic.name, &spans)?;
    // Against a source the read did not use; the markers the reader
    // passed are offsets no message fills.
    let again = broker.watermarks(topic)?;
    for (n, s) in received.iter_mut().zip(&spans) {
        *n += s.skipped;
    }
    check_against(&topic.name, &again, &received)
}

/// The reader's check of its own read: each partition gave exactly the
/// messages between its watermarks, no fewer (a skipped partition, a
/// reader that stops early) and no more.
fn check_read(topic: &str, spans: &[Span]) -> Result<()> {
    for (p, Span { low, high, read: n, skipped }) in spans.iter().enumerate() {
        let want = high - low;
        if n + skipped != want {
            return Err(Error::Kafka {
                context: format!("checking the read of topic {topic}"),
                cause: format!(
                    "partition {p} gave {n} messages and passed {skipped} markers between its watermarks {low}..{high}, which hold {want}"
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
                .map(|((low, high), read)| Span { low: *low, high: *high, read, skipped: 0 })
                .collect()
        };
        assert!(check_read("t", &spans([3, 0, 5])).is_ok());
        let short = check_read("t", &spans([3, 0, 4])).unwrap_err().to_string();
        assert!(
            short.contains(
                "partition 2 gave 4 messages and passed 0 markers between its watermarks 10..15, which hold 5"
            ),
            "{short}"
        );
        // A transaction's commit marker fills the offset the message lacks.
        let mut marked = spans([3, 0, 4]);
        marked[2].skipped = 1;
        assert!(check_read("t", &marked).is_ok());
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
