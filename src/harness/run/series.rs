//! The counters sampled for the report's chart (`series`) and the stage
//! marks (`stages`). The payments pipeline's own relays and notifiers
//! count what they publish and apply. A declared system's programs, and a
//! program under test in the pipeline, count nothing for the harness: for
//! them the published and applied figures are read from the broker, what
//! it holds rather than what anyone says, and a figure the broker did not
//! give is left out of its sample, never written as 0.

use crate::broker::{SharedBroker, Topic};
use crate::context::{Ctx, Stats};
use crate::report::{self, Sample};
use std::sync::Arc;
use std::time::Duration;

/// How long a sample waits for the broker's answer: past it the sample
/// goes without the broker's figures, and the next one waits for the same
/// read rather than queue another behind it (a paused broker would
/// otherwise pile up a blocked read every sample).
const READ_WAIT: Duration = Duration::from_millis(report::SAMPLE_EVERY_MS / 2);

/// The figures read from the broker for components that count nothing for
/// the harness.
///
/// Published: the sum of the topic's high watermarks, every message ever
/// written to it (the topic is the run's own, so it starts empty).
///
/// Applied: the offsets the consumer group committed, summed over the
/// partitions, and not the declared effects' rows. One offsets request
/// per sample, whatever the system; the effects are the user's own
/// queries, some of which count nothing (the orders example's stock is
/// one row per sku, whatever was applied), and a query over a large table
/// every 250 ms would load the database the run measures. A consumer that
/// commits its offsets after its database commit (docs/contract.md) has
/// applied at least that many messages. Both figures count topic offsets,
/// so the duplicates a relay published, and a transactional relay's
/// commit markers, count in each alike.
#[derive(Clone)]
pub(super) struct FromBroker {
    broker: SharedBroker,
    topic: Topic,
    group: String,
    published: bool,
    applied: bool,
}

impl FromBroker {
    /// For a run whose relays (`published`) or consumers (`applied`) count
    /// nothing for the harness; None when both count for themselves.
    pub fn of(ctx: &Ctx, published: bool, applied: bool) -> Option<Self> {
        (published || applied).then(|| Self {
            broker: ctx.broker.clone(),
            topic: ctx.topic(),
            group: ctx.names.group.clone(),
            published,
            applied,
        })
    }

    /// One read of the broker. Blocking.
    fn read(&self) -> Read {
        // The offsets first: a message committed by then was on the topic
        // before the watermarks are read, so a read never shows more
        // applied than published, and the apply stage never starts before
        // the publish stage.
        let committed = match self.applied {
            true => self.broker.taken(&self.group, &self.topic).ok(),
            false => None,
        };
        let published = match self.published {
            true => self.broker.written(&self.topic).ok().map(|n| n.max(0) as u64),
            false => None,
        };
        // Nothing committed yet reads as 0; whether the group ever commits
        // is told at the end ([`Sampler::finish`]).
        Read {
            published,
            applied: committed.map(|c| c.unwrap_or(0).max(0) as u64),
            committed: committed.is_some_and(|c| c.is_some()),
        }
    }
}

/// What one read of the broker gave: None where it did not answer.
#[derive(Debug, Clone, Copy, Default)]
struct Read {
    published: Option<u64>,
    applied: Option<u64>,
    /// The group had committed an offset on some partition.
    committed: bool,
}

/// Reads the broker off the async threads, one read at a time.
struct Reader {
    from: Arc<FromBroker>,
    pending: Option<tokio::task::JoinHandle<Read>>,
}

impl Reader {
    /// The read now, or nothing if the broker does not answer within
    /// [`READ_WAIT`] (the read stays pending for the next sample).
    async fn read(&mut self) -> Read {
        let mut h = self.pending.take().unwrap_or_else(|| {
            let from = self.from.clone();
            tokio::task::spawn_blocking(move || from.read())
        });
        match tokio::time::timeout(READ_WAIT, &mut h).await {
            Ok(read) => read.unwrap_or_default(),
            Err(_) => {
                self.pending = Some(h);
                Read::default()
            }
        }
    }
}

/// Builds the samples: the components' counters, and the broker's figures
/// in place of those its components do not count. Marks the stages that
/// only the broker shows when their figures grow.
struct Sampler {
    stats: Arc<Stats>,
    reader: Option<Reader>,
    published: u64,
    applied: u64,
    /// The group committed an offset at some sample.
    committed: bool,
}

impl Sampler {
    async fn sample(&mut self) -> Sample {
        let read = match &mut self.reader {
            Some(r) => r.read().await,
            None => Read::default(),
        };
        let s = &self.stats;
        // Stamped once the broker answered: its figures are of this moment.
        let mut sample = Sample {
            at_ms: s.origin.elapsed().as_millis() as u64,
            written: Stats::get(&s.payments_written),
            published: Some(Stats::get(&s.messages_published)),
            applied: Some(Stats::get(&s.events_applied)),
        };
        let Some(from) = self.reader.as_ref().map(|r| r.from.clone()) else { return sample };
        if from.published {
            sample.published = read.published;
            if read.published.is_some_and(|n| n > self.published) {
                self.published = read.published.unwrap_or_default();
                s.mark(&s.first_publish_ms, &s.last_publish_ms);
            }
        }
        if from.applied {
            sample.applied = read.applied;
            self.committed |= read.committed;
            if read.applied.is_some_and(|n| n > self.applied) {
                self.applied = read.applied.unwrap_or_default();
                s.mark(&s.first_apply_ms, &s.last_apply_ms);
            }
        }
        sample
    }

    /// The series as the report keeps it. A group that never committed an
    /// offset says nothing of what its consumers applied: its zeros are
    /// not a count, and the applied figure is left out of every sample.
    fn finish(&self, mut series: Vec<Sample>) -> Vec<Sample> {
        if self.reader.as_ref().is_some_and(|r| r.from.applied) && !self.committed {
            series.iter_mut().for_each(|s| s.applied = None);
        }
        series
    }
}

/// Samples the counters the progress line shows, and the broker's figures
/// for components that count nothing for the harness (`from`), for the
/// report's chart, until told to stop (then once more). Past
/// [`report::SERIES_MAX`] samples it keeps every other one and samples
/// half as often.
pub(super) fn sample(
    stats: Arc<Stats>,
    from: Option<FromBroker>,
    latest: tokio::sync::watch::Sender<Option<Sample>>,
) -> (tokio::task::JoinHandle<Vec<Sample>>, tokio::sync::oneshot::Sender<()>) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let reader = from.map(|f| Reader { from: Arc::new(f), pending: None });
    let mut sampler = Sampler { stats, reader, published: 0, applied: 0, committed: false };
    let task = tokio::spawn(async move {
        let mut every = Duration::from_millis(report::SAMPLE_EVERY_MS);
        let mut series = Vec::new();
        loop {
            let sample = sampler.sample().await;
            latest.send_replace(Some(sample));
            series.push(sample);
            if series.len() >= report::SERIES_MAX {
                series = series.into_iter().step_by(2).collect();
                every *= 2;
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = &mut stopped => break,
            }
        }
        series.push(sampler.sample().await);
        sampler.finish(series)
    });
    (task, stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::memory::Memory;
    use crate::broker::{Broker, ConsumerSpec, Producer};
    use crate::domain::events::Envelope;

    #[tokio::test(start_paused = true)]
    async fn the_series_stays_bounded_however_long_the_run() {
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.payments_written, 7);
        let (task, stop) = sample(stats, None, tokio::sync::watch::channel(None).0);
        // Three times as long as SERIES_MAX samples at the first rate.
        let long = Duration::from_millis(report::SAMPLE_EVERY_MS * 3 * report::SERIES_MAX as u64);
        tokio::time::sleep(long).await;
        let _ = stop.send(());
        let series = task.await.unwrap();
        assert!(series.len() <= report::SERIES_MAX, "{} samples", series.len());
        assert!(series.len() >= report::SERIES_MAX / 2, "thinned too far: {} samples", series.len());
        assert!(series.iter().all(|s| s.written == 7 && s.published == Some(0) && s.applied == Some(0)));
    }

    fn from(broker: &Memory, group: &str) -> FromBroker {
        FromBroker {
            broker: Arc::new(broker.clone()),
            topic: Topic::new("t", 2),
            group: group.into(),
            published: true,
            applied: true,
        }
    }

    async fn sampled(from: FromBroker, run: Duration) -> (Vec<Sample>, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let (task, stop) = sample(stats.clone(), Some(from), tokio::sync::watch::channel(None).0);
        tokio::time::sleep(run).await;
        let _ = stop.send(());
        (task.await.unwrap(), stats)
    }

    /// Issue 64: a declared system's series showed 0 published and 0
    /// applied for the whole run. Its figures come from the broker: the
    /// topic's messages and the group's committed offsets, and the stages
    /// are marked where they grew.
    #[tokio::test]
    async fn a_system_that_counts_nothing_is_read_from_the_broker() {
        let b = Memory::new();
        b.create_topic(&Topic::new("t", 2)).await.unwrap();
        let ids: Vec<uuid::Uuid> = (0..10).map(|_| uuid::Uuid::new_v4()).collect();
        let batch: Vec<Envelope> = ids.iter().map(|i| Envelope::new(*i, *i, "OrderPlaced", b"{}")).collect();
        b.publish("t", &batch, true).await.unwrap();
        let spec = ConsumerSpec {
            group: "g".into(),
            topic: "t".into(),
            member: "consumer-1".into(),
            session: Duration::from_secs(1),
            on_assign: Arc::new(|_| {}),
        };
        let c = b.consumer(spec).unwrap();
        c.join().unwrap();
        // A poll takes the member into the group's generation.
        c.poll_batch(100, Duration::from_millis(20), Duration::ZERO, &mut |_| {}).await;
        c.commit(&[(0, 3).into(), (1, 4).into()], true).unwrap();
        let (series, stats) = sampled(from(&b, "g"), Duration::from_millis(600)).await;
        assert!(series.len() >= 2, "{series:?}");
        assert!(series.iter().all(|s| s.published == Some(10) && s.applied == Some(7)), "{series:?}");
        let rep = crate::report::assemble::stages_of(&stats);
        assert!(rep.first_publish_ms.is_some() && rep.first_apply_ms.is_some(), "{rep:?}");
        assert!(rep.first_write_ms.is_none(), "nothing was written: no write stage, not 0: {rep:?}");
        // A group that never committed says nothing of what was applied.
        let (series, stats) = sampled(from(&b, "another"), Duration::from_millis(300)).await;
        assert!(series.iter().all(|s| s.published == Some(10) && s.applied.is_none()), "{series:?}");
        assert!(crate::report::assemble::stages_of(&stats).first_apply_ms.is_none());
    }
}
