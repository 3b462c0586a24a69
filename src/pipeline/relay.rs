//! Outbox relays. Each one loops: claim a batch of unpublished rows, produce
//! them and await every ack, then mark them published and commit.
//!
//! Fault point `relay.after_produce`: after the acks and before the commit the
//! relay may crash. The crash drops the database socket with the transaction
//! open and drops the producer: no commit, no rollback, no cleanup. The rows
//! become claimable again and the whole batch is published a second time,
//! which is where the topic's duplicates come from.

use crate::broker::Producer;
use crate::context::{Ctx, Shutdown, Stats, RESTART_FLOOR};
use crate::domain::events::Envelope;
use crate::faults::{Confirm, FaultPoint, Reach};
use crate::pipeline::supervise::{self, Counters, Ending};
use crate::scenario::{RelayAcks, RelayCursor, RelayEventId, RelayOrder};
use crate::store::{OutboxRow, RelayConn};
use std::time::Duration;
use tracing::{debug, warn};

/// How long `relay.slow_produce` holds a claimed batch before producing.
const SLOW_PRODUCE: Duration = Duration::from_millis(300);

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
    /// A lane the topic does not have.
    lane: i32,
}

/// Runs relay number `index` until shutdown: the supervisor. Every crash
/// and every restart goes through here: the incarnation dies as a process
/// would (its database socket closes with the claim open, its producer goes,
/// nothing is flushed or rolled back), the supervisor pauses, and a new
/// incarnation starts with a new producer and a new connection.
pub async fn run(ctx: Ctx, index: usize) {
    let name = format!("relay-{index}");
    let cfg = ctx.scenario.relay.clone();
    let mut shutdown = ctx.shutdown.clone();
    // The fault point that ended the previous incarnation when its effect is
    // this one starting.
    let mut ended_by: Option<FaultPoint> = None;
    loop {
        if shutdown.is_set() {
            return;
        }
        let ending = match Incarnation::start(&ctx, &name).await {
            Ok(mut inc) => {
                if let Some(point) = ended_by.take() {
                    ctx.faults.confirm(point, 1);
                }
                let ending = inc.run(&mut shutdown).await;
                inc.die();
                ending
            }
            Err(e) => Ending::Error { what: "starting", cause: e.to_string() },
        };
        if let Ending::Crash { confirmed_by_restart } = &ending {
            ended_by = *confirmed_by_restart;
        }
        let counters = Counters { crashes: &ctx.stats.relay_crashes, errors: &ctx.stats.relay_errors };
        if !supervise::after(ending, &name, counters, cfg.restart_delay, &mut shutdown).await {
            return;
        }
    }
}

/// One life of a relay: its producer and its database connection. It reads
/// top to bottom as claim → produce → mark, with the fault points between.
struct Incarnation<'a> {
    ctx: &'a Ctx,
    name: &'a str,
    producer: Box<dyn Producer>,
    conn: RelayConn,
    /// With `relay.cursor = "seq"`, the highest `seq` this incarnation
    /// published (kept in memory, so a restart starts over); 0 otherwise.
    cursor: i64,
}

/// What one pass of an incarnation did.
enum Step {
    /// A batch went out (or was given back); claim the next at once.
    Batch,
    /// Nothing to claim: wait a poll interval.
    Idle,
    End(Ending),
}

impl<'a> Incarnation<'a> {
    async fn start(ctx: &'a Ctx, name: &'a str) -> crate::error::Result<Incarnation<'a>> {
        let producer = ctx.broker.producer_for(acks_of(ctx.scenario.relay.producer))?;
        let conn = ctx.store.relay_connection().await?;
        Ok(Incarnation { ctx, name, producer, conn, cursor: 0 })
    }

    /// The crash, or the end of a clean stop: the connection is dropped
    /// with whatever claim it holds (no ROLLBACK), the producer discarded.
    fn die(self) {
        self.conn.crash();
        drop(self.producer);
    }

    async fn run(&mut self, shutdown: &mut Shutdown) -> Ending {
        loop {
            if shutdown.is_set() {
                return Ending::Shutdown;
            }
            match self.step(shutdown).await {
                Step::Batch => {}
                Step::Idle => {
                    if shutdown.sleep(self.ctx.scenario.relay.poll_interval).await {
                        return Ending::Shutdown;
                    }
                }
                Step::End(e) => return e,
            }
        }
    }

    /// One batch: claim → [the mistakes that mark or delete first] →
    /// `relay.before_produce` → `relay.slow_produce` → produce, awaiting the
    /// acks (`relay.produce_error`) → `relay.after_produce` → mark →
    /// `relay.after_mark`.
    async fn step(&mut self, shutdown: &mut Shutdown) -> Step {
        let (ctx, name) = (self.ctx, self.name);
        let cfg = &ctx.scenario.relay;
        let fail = |what: &'static str, e: crate::Error| Step::End(Ending::Error { what, cause: e.to_string() });
        // The registry says whether the next incarnation confirms the crash.
        let crash = |point: FaultPoint| {
            let by_restart = point.confirm() == Confirm::NextIncarnation;
            Step::End(Ending::Crash { confirmed_by_restart: by_restart.then_some(point) })
        };
        let rows = match self.conn.claim(cfg.batch_size, self.cursor).await {
            Ok(r) => r,
            Err(e) => return fail("claiming outbox rows", e),
        };
        if rows.is_empty() {
            return match self.conn.end_claim().await {
                Ok(()) => Step::Idle,
                Err(e) => fail("ending an empty claim", e),
            };
        }
        let span =
            || format!("batch of {} events, outbox seq {}..={}", rows.len(), rows[0].seq, rows[rows.len() - 1].seq);
        // The batch's outbox rows, logged with a firing: what ties an
        // anomaly's event to the crash that repeated or lost it.
        let reach = || Reach::outbox(rows.iter().map(|r| r.seq));
        let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
        if let Err(step) = self.mark_first(&ids).await {
            return step;
        }
        if ctx.faults.strike_reaching(FaultPoint::RelayBeforeProduce, name, span, reach) {
            // Publish-then-mark loses nothing here (the claim dies with the
            // connection); the mistakes above have already lost the batch.
            ctx.faults.halt(FaultPoint::RelayBeforeProduce).await;
            return crash(FaultPoint::RelayBeforeProduce);
        }
        let refuse = self.shape_produce(&rows, span, reach).await;
        let how = Publish { refuse, minted: cfg.event_id == RelayEventId::Minted, acks: cfg.acks };
        if let Err(cause) = publish(self.producer.as_ref(), &ctx.names.topic, &rows, how).await {
            return self.produce_failed(cause, rows.len(), refuse.is_some(), shutdown).await;
        }
        Stats::add(&ctx.stats.messages_published, rows.len() as u64);
        ctx.stats.mark(&ctx.stats.first_publish_ms, &ctx.stats.last_publish_ms);
        if ctx.faults.strike_reaching(FaultPoint::RelayAfterProduce, name, span, reach) {
            // The batch will be published again: its first event twice.
            ctx.faults.await_copies(FaultPoint::RelayAfterProduce, rows[0].id, 2);
            ctx.faults.halt(FaultPoint::RelayAfterProduce).await;
            return crash(FaultPoint::RelayAfterProduce);
        }
        if cfg.order == RelayOrder::PublishThenMark {
            // On failure the rows stay unpublished and go out again: a
            // duplicate on the topic, never a loss.
            if let Err(e) = self.conn.mark_published(&ids).await {
                return fail("marking published", e);
            }
        }
        if ctx.faults.strike_reaching(FaultPoint::RelayAfterMark, name, span, reach) {
            // Everything of this batch is done; the crash costs nothing.
            ctx.faults.halt(FaultPoint::RelayAfterMark).await;
            return crash(FaultPoint::RelayAfterMark);
        }
        if cfg.cursor == RelayCursor::Seq {
            // The mistake: insert order taken for commit order.
            self.cursor = self.cursor.max(rows[rows.len() - 1].seq);
        }
        Stats::add(&ctx.stats.relay_batches, 1);
        debug!(relay = %name, events = rows.len(), "batch published");
        Step::Batch
    }

    /// The faults that shape the produce: `relay.slow_produce` holds the
    /// claim first, `relay.produce_error` has one message refused.
    async fn shape_produce(
        &self,
        rows: &[OutboxRow],
        span: impl Fn() -> String,
        reach: impl Fn() -> Reach,
    ) -> Option<Refuse> {
        let (ctx, name) = (self.ctx, self.name);
        if ctx.faults.strike_reaching(FaultPoint::RelaySlowProduce, name, &span, &reach) {
            // Holding the claim while others skip past it: later rows reach
            // the topic first.
            tokio::time::sleep(SLOW_PRODUCE).await;
            ctx.faults.confirm(FaultPoint::RelaySlowProduce, 1);
        }
        ctx.faults.strike_reaching(FaultPoint::RelayProduceError, name, &span, &reach).then(|| {
            // Confirmed when the batch goes out again: its first event
            // twice, or once when it is the refused one.
            let copies = if rows.len() > 1 { 2 } else { 1 };
            ctx.faults.await_copies(FaultPoint::RelayProduceError, rows[0].id, copies);
            Refuse { row: rows.len() - 1, lane: ctx.topic().lanes }
        })
    }

    /// The mistakes that write the batch off before producing it: marked
    /// published (mark-then-publish) or deleted (delete-then-publish) and
    /// committed before the broker has it. Nothing for the correct order.
    async fn mark_first(&mut self, ids: &[uuid::Uuid]) -> Result<(), Step> {
        let failed = |what: &'static str, e: crate::Error| Step::End(Ending::Error { what, cause: e.to_string() });
        match self.ctx.scenario.relay.order {
            RelayOrder::PublishThenMark => Ok(()),
            RelayOrder::MarkThenPublish => {
                self.conn.mark_published(ids).await.map_err(|e| failed("marking published", e))
            }
            RelayOrder::DeleteThenPublish => {
                self.conn.delete_claimed(ids).await.map_err(|e| failed("deleting the claimed rows", e))
            }
        }
    }

    /// A produce whose delivery failed. The correct relay gives the batch
    /// back (a controlled failure: the rows are free again) and carries on
    /// after the restart floor; a batch already marked or deleted has
    /// nothing left to give back, so that incarnation restarts.
    async fn produce_failed(&mut self, cause: String, events: usize, injected: bool, shutdown: &mut Shutdown) -> Step {
        let (ctx, name, cfg) = (self.ctx, self.name, &self.ctx.scenario.relay);
        if cfg.order != RelayOrder::PublishThenMark {
            return Step::End(Ending::Error { what: "producing a batch already marked", cause });
        }
        Stats::add(&ctx.stats.relay_errors, 1);
        if injected {
            // The injected failure: expected, so not a warning.
            debug!(relay = %name, %cause, events, "refused produce; giving the batch back");
        } else {
            warn!(relay = %name, %cause, events, "produce failed; giving the batch back");
        }
        if let Err(e) = self.conn.release().await {
            return Step::End(Ending::Error { what: "giving a batch back", cause: e.to_string() });
        }
        match shutdown.sleep(cfg.restart_delay.max(RESTART_FLOOR)).await {
            true => Step::End(Ending::Shutdown),
            false => Step::Batch,
        }
    }
}

/// Produces every row of the batch as its envelope and, unless the relay
/// makes the fire-and-forget mistake, waits for every ack.
async fn publish(producer: &dyn Producer, topic: &str, rows: &[OutboxRow], how: Publish) -> Result<(), String> {
    let batch: Vec<Envelope> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            // The relay-minted id mistake: each copy of an event gets a new id,
            // so the inbox cannot tell a republished event from a new one.
            let id = if how.minted { crate::domain::events::time_ordered_id() } else { r.id };
            let mut e = Envelope::new(id, r.aggregate_id, &r.event_type, &r.payload);
            e.lane = how.refuse.filter(|f| f.row == i).map(|f| f.lane);
            e
        })
        .collect();
    // Fire and forget: the sends are queued, and the relay goes on to mark
    // without knowing whether any of them reached the broker.
    producer.publish(topic, &batch, how.acks != RelayAcks::FireAndForget).await
}

/// The broker's acks for the scenario's `relay.producer`.
fn acks_of(producer: crate::scenario::RelayProducer) -> crate::broker::ProducerAcks {
    match producer {
        crate::scenario::RelayProducer::Idempotent => crate::broker::ProducerAcks::AllReplicasIdempotent,
        crate::scenario::RelayProducer::LeaderAck => crate::broker::ProducerAcks::LeaderOnly,
    }
}

#[cfg(test)]
mod tests {
    //! The relay's crash semantics, on the in-memory broker and SQLite.
    use crate::context::Stats;
    use crate::faults::FaultPoint;
    use crate::pipeline::testing::{anomalies, harness, Harness};
    use std::time::Duration;

    /// The workload writes 300 payments (600 outbox events), then one relay
    /// publishes them; no notifier runs.
    async fn relay_alone(relay_and_faults: &str) -> Harness {
        let toml = format!(
            "name = \"unit\"\nseed = 11\n[workload]\npayments = 300\nproducers = 2\n[topic]\npartitions = 3\n{relay_and_faults}"
        );
        let h = harness(&toml).await;
        crate::pipeline::workload::run(h.ctx.clone()).await.expect("the workload");
        let relay = tokio::spawn(super::run(h.ctx.clone(), 1));
        assert!(h.drain(Duration::from_secs(20), false).await, "the outbox is published within 20 s");
        h.stop(vec![relay]).await;
        h
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_after_the_acks_publishes_the_batch_again_and_loses_nothing() {
        let h = relay_alone("[relay]\nbatch_size = 20\n[faults]\nrelay_after_produce = 0.3\n").await;
        let fired = h.ctx.faults.fired(FaultPoint::RelayAfterProduce);
        assert!(fired > 0, "the fault fired");
        assert_eq!(Stats::get(&h.ctx.stats.relay_crashes), fired, "each firing is one crash and restart");
        let r = h.reconcile().await;
        assert_eq!(r.counts.topic_distinct_events, r.counts.outbox_events, "every event on the topic");
        assert!(r.counts.topic_duplicates >= 20 * fired, "each crashed batch of 20 went out twice: {:?}", r.counts);
        assert!(!anomalies(&r).contains(&"lost event".to_string()), "{:?}", anomalies(&r));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_before_the_produce_gives_the_claim_back() {
        let h = relay_alone("[relay]\nbatch_size = 20\n[faults]\nrelay_before_produce = 0.3\n").await;
        assert!(h.ctx.faults.fired(FaultPoint::RelayBeforeProduce) > 0, "the fault fired");
        let r = h.reconcile().await;
        assert_eq!(r.counts.topic_distinct_events, r.counts.outbox_events, "every event on the topic");
        assert_eq!(r.counts.topic_duplicates, 0, "nothing was produced before the crash");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn marking_before_publishing_loses_the_batches_a_crash_interrupts() {
        let relay = "[relay]\nbatch_size = 20\norder = \"mark-then-publish\"\n[faults]\nrelay_before_produce = 0.3\n";
        let h = relay_alone(relay).await;
        let fired = h.ctx.faults.fired(FaultPoint::RelayBeforeProduce);
        assert!(fired > 0, "the fault fired");
        let r = h.reconcile().await;
        assert_eq!(r.counts.outbox_events - r.counts.topic_distinct_events, 20 * fired, "{:?}", r.counts);
        assert!(anomalies(&r).contains(&"lost event".to_string()), "{:?}", anomalies(&r));
    }
}
