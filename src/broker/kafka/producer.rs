//! The relay's producer on Kafka.

use super::config;
use crate::broker::OffRuntime;
use crate::domain::events::{Envelope, HEADER_EVENT_ID, HEADER_EVENT_TYPE};
use crate::error::{Error, Result};
use futures::future::BoxFuture;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use std::time::Duration;

/// How long one produce may wait for its ack before the batch is given back.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(15);

/// Idempotent (no duplicates from its own retries, order kept per
/// partition), acks from all replicas; or, for `relay.producer =
/// "leader-ack"`, acks from the leader alone. Dropped off the async threads:
/// its drop purges its queue and joins a thread.
pub struct KafkaProducer(OffRuntime<FutureProducer>);

impl KafkaProducer {
    pub fn new(brokers: &str, acks: crate::broker::ProducerAcks) -> Result<Self> {
        let (acks, idempotent) = match acks {
            crate::broker::ProducerAcks::AllReplicasIdempotent => ("all", "true"),
            crate::broker::ProducerAcks::LeaderOnly => ("1", "false"),
        };
        let p = config(brokers)
            .set("acks", acks)
            .set("enable.idempotence", idempotent)
            .set("linger.ms", "2")
            .set("compression.type", "none")
            .set("message.timeout.ms", PRODUCE_TIMEOUT.as_millis().to_string())
            .create()
            .map_err(|e| Error::kafka("creating a producer", e))?;
        Ok(Self(OffRuntime::new(p)))
    }
}

impl crate::broker::Producer for KafkaProducer {
    /// All sends are in flight at once; the idempotent producer keeps their
    /// order within a partition. The acks are awaited one by one, in the
    /// order sent: they arrive in about that order, and one pass over the
    /// list costs less than a join of thousands of futures.
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        batch: &'a [Envelope<'a>],
        await_acks: bool,
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        Box::pin(async move {
            let producer = &*self.0;
            let mut acks = Vec::with_capacity(batch.len());
            for e in batch {
                let headers = OwnedHeaders::new_with_capacity(2)
                    .insert(Header { key: HEADER_EVENT_ID, value: Some(e.event_id.as_bytes()) })
                    .insert(Header { key: HEADER_EVENT_TYPE, value: Some(e.event_type.as_bytes()) });
                let mut record = FutureRecord::to(topic).key(e.key.as_bytes()).payload(e.payload).headers(headers);
                if let Some(p) = e.lane {
                    record = record.partition(p);
                }
                match producer.send_result(record) {
                    Ok(ack) => acks.push(ack),
                    // Fire and forget ignores what the send said, too.
                    Err(_) if !await_acks => {}
                    // The local queue is full: wait for room (bounded by the timeout).
                    Err((_, record)) => match producer.send(record, Timeout::After(PRODUCE_TIMEOUT)).await {
                        Ok(_) => {}
                        Err((e, _)) => return Err(e.to_string()),
                    },
                }
            }
            if !await_acks {
                return Ok(());
            }
            for ack in acks {
                match ack.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => return Err(e.to_string()),
                    Err(_) => return Err("the producer went away before the ack".into()),
                }
            }
            Ok(())
        })
    }
}
