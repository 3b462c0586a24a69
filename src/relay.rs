//! Outbox relays. Each one loops: claim a batch of unpublished rows, produce
//! them and await every ack, then mark them published and commit.
//!
//! Fault point `relay.after_produce`: after the acks and before the commit the
//! relay may crash. The crash drops the database socket with the transaction
//! open and drops the producer: no commit, no rollback, no cleanup. The rows
//! become claimable again and the whole batch is published a second time,
//! which is where the topic's duplicates come from.

use crate::context::{Ctx, Shutdown, Stats, RESTART_FLOOR};
use crate::faults::FaultPoint;
use crate::infra::kafka_config;
use crate::scenario::{RelayAcks, RelayEventId, RelayOrder};
use crate::store::{OutboxRow, RelayConn};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use std::time::Duration;
use tracing::{debug, warn};

/// How long `relay.slow_produce` holds a claimed batch before producing.
const SLOW_PRODUCE: Duration = Duration::from_millis(300);

/// How long one produce may wait for its ack before the batch is given back.
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(15);

/// A producer as a relay uses it: idempotent (no duplicates from its own
/// retries, order kept per partition), acks from all replicas.
pub fn producer(brokers: &str) -> Result<FutureProducer, rdkafka::error::KafkaError> {
    kafka_config(brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .set("compression.type", "none")
        .set("message.timeout.ms", PRODUCE_TIMEOUT.as_millis().to_string())
        .create()
}

/// Drops a producer off the async threads: its drop purges and joins a thread.
fn discard(p: FutureProducer) {
    tokio::task::spawn_blocking(move || drop(p));
}

/// A fault point fired: the relay dies as a process would (the socket closes
/// with the claim open, the producer goes, nothing is flushed or rolled back)
/// and pauses before its next incarnation. True when the run is stopping.
async fn crash(ctx: &Ctx, conn: RelayConn, producer: FutureProducer, shutdown: &mut Shutdown) -> bool {
    Stats::add(&ctx.stats.relay_crashes, 1);
    conn.crash();
    discard(producer);
    shutdown.sleep(ctx.scenario.relay.restart_delay).await
}

/// How a batch is published: the faults and mistakes that shape it.
#[derive(Debug, Clone, Copy)]
struct Publish {
    refuse: Option<Refuse>,
    /// A fresh event id per message (the relay-minted id mistake).
    minted: bool,
    acks: RelayAcks,
}

/// One message of a batch made undeliverable, for `relay.produce_error`: it
/// is addressed to a partition the topic does not have, so the client
/// reports a delivery error for it through the same path as a refused
/// produce, while the rest of the batch is acked.
#[derive(Debug, Clone, Copy)]
struct Refuse {
    /// Index of the refused row in the batch (the last one, so the rest are
    /// on the topic before the relay sees the error).
    row: usize,
    /// A partition the topic does not have.
    partition: i32,
}

/// Marks the batch published and commits the claim. On failure the caller
/// reconnects; with publish-then-mark the rows stay unpublished and go out
/// again, a duplicate on the topic, never a loss.
async fn mark(ctx: &Ctx, name: &str, conn: &mut RelayConn, ids: &[uuid::Uuid]) -> bool {
    match conn.mark_published(ids).await {
        Ok(()) => true,
        Err(e) => {
            warn!(relay = %name, cause = %e, "marking published failed; reconnecting");
            Stats::add(&ctx.stats.relay_errors, 1);
            false
        }
    }
}

/// Runs relay number `index` until shutdown, restarting after each crash.
pub async fn run(ctx: Ctx, index: usize) {
    let name = format!("relay-{index}");
    let cfg = ctx.scenario.relay.clone();
    let mut shutdown = ctx.shutdown.clone();
    // The fault point that ended the previous incarnation: its effect is
    // this one starting.
    let mut ended_by: Option<FaultPoint> = None;
    'incarnation: loop {
        if shutdown.is_set() {
            return;
        }
        let producer = match producer(&ctx.brokers) {
            Ok(p) => p,
            Err(e) => {
                warn!(relay = %name, cause = %e, "cannot create a producer");
                Stats::add(&ctx.stats.relay_errors, 1);
                if shutdown.sleep(cfg.restart_delay.max(RESTART_FLOOR)).await {
                    return;
                }
                continue;
            }
        };
        let mut conn = match ctx.store.relay_connection().await {
            Ok(c) => c,
            Err(e) => {
                warn!(relay = %name, cause = %e, "cannot open a database connection");
                Stats::add(&ctx.stats.relay_errors, 1);
                discard(producer);
                if shutdown.sleep(cfg.restart_delay.max(RESTART_FLOOR)).await {
                    return;
                }
                continue;
            }
        };
        if let Some(point) = ended_by.take() {
            ctx.faults.confirm(point, 1);
        }
        loop {
            if shutdown.is_set() {
                discard(producer);
                return;
            }
            let rows = match conn.claim(cfg.batch_size).await {
                Ok(r) => r,
                Err(e) => {
                    warn!(relay = %name, cause = %e, "claim failed; reconnecting");
                    Stats::add(&ctx.stats.relay_errors, 1);
                    conn.crash();
                    discard(producer);
                    if shutdown.sleep(cfg.restart_delay.max(RESTART_FLOOR)).await {
                        return;
                    }
                    continue 'incarnation;
                }
            };
            if rows.is_empty() {
                if conn.end_claim().await.is_err() {
                    conn.crash();
                    discard(producer);
                    continue 'incarnation;
                }
                if shutdown.sleep(cfg.poll_interval).await {
                    discard(producer);
                    return;
                }
                continue;
            }
            let span =
                || format!("batch of {} events, outbox seq {}..={}", rows.len(), rows[0].seq, rows[rows.len() - 1].seq);
            let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
            // The mistake of mark-then-publish: the rows are marked published
            // and committed before the broker has them.
            if cfg.order == RelayOrder::MarkThenPublish && !mark(&ctx, &name, &mut conn, &ids).await {
                conn.crash();
                discard(producer);
                continue 'incarnation;
            }
            // The mistake of delete-then-publish: the rows are gone, committed,
            // before the broker has them.
            if cfg.order == RelayOrder::DeleteThenPublish {
                if let Err(e) = conn.delete_claimed(&ids).await {
                    warn!(relay = %name, cause = %e, "deleting the claimed rows failed; reconnecting");
                    Stats::add(&ctx.stats.relay_errors, 1);
                    conn.crash();
                    discard(producer);
                    continue 'incarnation;
                }
            }
            if ctx.faults.strike(FaultPoint::RelayBeforeProduce, &name, span) {
                // Publish-then-mark loses nothing here (the claim dies with
                // the connection); mark-then-publish has already lost the batch.
                if crash(&ctx, conn, producer, &mut shutdown).await {
                    return;
                }
                ended_by = Some(FaultPoint::RelayBeforeProduce);
                continue 'incarnation;
            }
            if ctx.faults.strike(FaultPoint::RelaySlowProduce, &name, span) {
                // Holding the claim while others skip past it: later rows
                // reach the topic first.
                tokio::time::sleep(SLOW_PRODUCE).await;
                ctx.faults.confirm(FaultPoint::RelaySlowProduce, 1);
            }
            let refuse = ctx.faults.strike(FaultPoint::RelayProduceError, &name, span).then(|| {
                // Confirmed when the batch goes out again: its first event
                // twice, or once when it is the refused one.
                let copies = if rows.len() > 1 { 2 } else { 1 };
                ctx.faults.await_copies(FaultPoint::RelayProduceError, rows[0].id, copies);
                Refuse { row: rows.len() - 1, partition: ctx.scenario.partitions }
            });
            let how = Publish { refuse, minted: cfg.event_id == RelayEventId::Minted, acks: cfg.acks };
            if let Err(cause) = publish(&producer, &ctx.names.topic, &rows, how).await {
                if refuse.is_some() {
                    // The injected failure: expected, so not a warning.
                    debug!(relay = %name, %cause, events = rows.len(), "refused produce; giving the batch back");
                } else {
                    warn!(relay = %name, %cause, events = rows.len(), "produce failed; giving the batch back");
                }
                Stats::add(&ctx.stats.relay_errors, 1);
                // Marked or deleted already: there is nothing left to give back.
                if cfg.order != RelayOrder::PublishThenMark || conn.release().await.is_err() {
                    conn.crash();
                    discard(producer);
                    continue 'incarnation;
                }
                if shutdown.sleep(cfg.restart_delay.max(RESTART_FLOOR)).await {
                    discard(producer);
                    return;
                }
                continue;
            }
            Stats::add(&ctx.stats.messages_published, rows.len() as u64);
            ctx.stats.mark(&ctx.stats.first_publish_ms, &ctx.stats.last_publish_ms);
            if ctx.faults.strike(FaultPoint::RelayAfterProduce, &name, span) {
                // The batch will be published again: its first event twice.
                ctx.faults.await_copies(FaultPoint::RelayAfterProduce, rows[0].id, 2);
                if crash(&ctx, conn, producer, &mut shutdown).await {
                    return;
                }
                continue 'incarnation;
            }
            if cfg.order == RelayOrder::PublishThenMark && !mark(&ctx, &name, &mut conn, &ids).await {
                conn.crash();
                discard(producer);
                continue 'incarnation;
            }
            if ctx.faults.strike(FaultPoint::RelayAfterMark, &name, span) {
                // Everything of this batch is done; the crash costs nothing.
                if crash(&ctx, conn, producer, &mut shutdown).await {
                    return;
                }
                ended_by = Some(FaultPoint::RelayAfterMark);
                continue 'incarnation;
            }
            Stats::add(&ctx.stats.relay_batches, 1);
            debug!(relay = %name, events = rows.len(), "batch published");
        }
    }
}

/// Produces every row and waits for every ack. All sends are in flight at
/// once; the idempotent producer keeps their order within a partition. The
/// acks are awaited one by one, in the order sent: they arrive in about that
/// order, and one pass over the list costs less than a join of thousands of
/// futures.
async fn publish(producer: &FutureProducer, topic: &str, rows: &[OutboxRow], how: Publish) -> Result<(), String> {
    let mut acks = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        // The relay-minted id mistake: each copy of an event gets a new id,
        // so the inbox cannot tell a republished event from a new one.
        let id = if how.minted { crate::events::time_ordered_id() } else { r.id };
        let (id, key) = (id.to_string(), r.aggregate_id.to_string());
        let headers = OwnedHeaders::new_with_capacity(2)
            .insert(Header { key: crate::events::HEADER_EVENT_ID, value: Some(id.as_bytes()) })
            .insert(Header { key: crate::events::HEADER_EVENT_TYPE, value: Some(r.event_type.as_bytes()) });
        let mut record = FutureRecord::to(topic).key(key.as_bytes()).payload(&r.payload).headers(headers);
        if let Some(f) = how.refuse.filter(|f| f.row == i) {
            record = record.partition(f.partition);
        }
        match producer.send_result(record) {
            Ok(ack) => acks.push(ack),
            // Fire and forget ignores what the send said, too.
            Err(_) if how.acks == RelayAcks::FireAndForget => {}
            // The local queue is full: wait for room (bounded by the timeout).
            Err((_, record)) => match producer.send(record, Timeout::After(PRODUCE_TIMEOUT)).await {
                Ok(_) => {}
                Err((e, _)) => return Err(e.to_string()),
            },
        }
    }
    if how.acks == RelayAcks::FireAndForget {
        // The mistake: the sends are queued, and the relay goes on to mark
        // without knowing whether any of them reached the broker.
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
}
