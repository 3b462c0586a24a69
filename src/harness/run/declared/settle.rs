//! What a declared system answers as it comes to rest (the run's skeleton
//! owns the loops, `super::super::phases`): its work left for the drain,
//! its pending work for the settle, and the liveness anomalies of what
//! never finished (late, not lost).

use crate::context::Ctx;
use crate::error::Result;
use crate::harness::run::drive::{self, DrainClock, Left, Undrained};
use crate::scenario::{Published, System};
use crate::store::declared as rows;
use crate::store::Store;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Waits until every outbox row is marked published (or, with no mark,
/// the topic holds as many messages as the outbox log) and the consumer
/// group's lag is zero, twice in a row.
pub(super) async fn drain(ctx: &Ctx, pg: &Store, sys: &System) -> std::result::Result<(), Undrained> {
    let left = || async {
        let unpublished = match rows::unpublished(pg, &sys.outbox).await? {
            Some(n) => n,
            // No mark: what the log holds and the topic does not yet.
            None => match rows::logged(pg).await? - ctx.broker.held(&ctx.topic())? {
                n if n > 0 => n,
                // The topic's length is no proof of the rest: an
                // at-least-once relay's replays and a transactional one's
                // markers count in it too. Its distinct event ids are.
                _ => (rows::logged(pg).await? - distinct_on_topic(ctx).await?).max(0),
            },
        };
        // A process the nemesis holds stopped (a zombie) holds up the
        // rest, a correct consumer's new owner waiting on its claim.
        Ok(Left { unpublished, busy: ctx.coord.zombies() > 0 })
    };
    let what = match sys.outbox.published {
        Published::Column(_) | Published::Delete => "outbox rows unpublished",
        Published::None => "outbox events not yet on the topic",
    };
    drive::drain_until_done(ctx, "the system", what, left).await
}

/// How many distinct event ids the topic holds: read whole, off the async
/// threads. Only near the drain's end, once its length has caught up.
async fn distinct_on_topic(ctx: &Ctx) -> Result<i64> {
    let (broker, topic) = (ctx.broker.clone(), ctx.topic());
    let read = tokio::task::spawn_blocking(move || {
        let mut ids = std::collections::HashSet::new();
        broker.read_topic(&topic, Duration::from_secs(60), &mut |d| {
            if let Some(id) = d.event_id {
                ids.insert(id.to_vec());
            }
        })?;
        Ok(ids.len() as i64)
    });
    read.await.map_err(|e| crate::Error::Internal(format!("reading the topic's event ids: {e}")))?
}

/// Outbox rows the relays never published, not even once the faults had
/// stopped and they had one more drain timeout.
#[derive(Clone)]
pub(crate) struct RelayStall {
    /// How many rows were left at the drain's last reading.
    left: i64,
    /// Their keys, when the relay keeps a mark (a column or a delete).
    keys: Vec<String>,
    /// How long the drain had waited, faults and fault-free together.
    waited: Duration,
    /// How much of it was without faults.
    fault_free: Duration,
}

impl RelayStall {
    pub(super) async fn read(pg: &Store, sys: &System, left: i64, waited: Duration, fault_free: Duration) -> Self {
        let keys = match rows::unpublished_keys(pg, &sys.outbox).await {
            Ok(k) => k.unwrap_or_default(),
            Err(e) => {
                warn!(error = %e, "could not read the unpublished rows' keys");
                Vec::new()
            }
        };
        Self { left, keys, waited, fault_free }
    }
}

/// What never finished: work a consumer accepted, outbox rows no relay
/// published. Their keys are late, not lost.
#[derive(Default)]
pub(crate) struct Stalls {
    pub consumer: Option<Stall>,
    pub relay: Option<RelayStall>,
}

impl Stalls {
    /// The keys whose work a consumer still held: their effects are not
    /// expected yet.
    pub(super) fn pending(&self) -> Vec<String> {
        self.consumer.iter().flat_map(|s| s.keys.iter().cloned()).collect()
    }

    /// The keys of the rows the relay left unmarked: late, unless the
    /// topic shows them published (`Books::with_unpublished`).
    pub(super) fn unpublished(&self) -> Vec<String> {
        self.relay.iter().flat_map(|r| r.keys.iter().cloned()).collect()
    }
}

/// How often the settle reads the pending work and the effects' counts.
const SETTLE_POLL: Duration = Duration::from_millis(200);

/// Work the system accepted and never applied, when the settle ran out.
pub(crate) struct Stall {
    /// The pending rows' keys (an empty string for a row without one).
    keys: Vec<String>,
    /// How long the settle waited after the drain.
    waited: Duration,
    /// How it ran out: no progress within a drain timeout, or the cap.
    why: String,
}

/// After the drain: waits until the declared pending work (`[system]
/// pending`) is gone and every effect's count has stayed the same for
/// `[run] settle_quiet_ms`. The wait runs out on the drain's clock
/// ([`DrainClock`]): one drain timeout without a new low of pending rows,
/// or a few timeouts in all. So a consumer still applying its backlog is
/// late, not stalled; one that applies nothing for a timeout has stalled.
/// Counts still moving when it runs out are judged as they are; pending
/// work still there is a stall. `CHAOS_SKIP_SETTLE=1` judges at once (a
/// switch for tests that show the settle is what makes the difference).
/// `first` gets the pending rows of the first reading: the work the run
/// waits for, which the report shows.
pub(super) async fn settle(ctx: &Ctx, pg: &Store, sys: &System, first: &mut Option<u64>) -> Result<Option<Stall>> {
    if std::env::var_os("CHAOS_SKIP_SETTLE").is_some() {
        warn!("CHAOS_SKIP_SETTLE: judging at once, without waiting for pending work");
        return Ok(None);
    }
    let quiet = ctx.scenario.settle_quiet;
    let started = Instant::now();
    let mut clock = DrainClock::new(ctx.scenario.drain_timeout);
    let (mut last, mut since) = (None, Instant::now());
    loop {
        let pending = match &sys.pending {
            Some(q) => rows::pending(pg, q).await?,
            None => Vec::new(),
        };
        if sys.pending.is_some() && first.is_none() {
            *first = Some(pending.len() as u64);
        }
        let counts = rows::effect_counts(pg, sys).await?;
        clock.left(pending.len() as i64);
        if !pending.is_empty() || last.as_ref() != Some(&counts) {
            since = Instant::now();
        }
        last = Some(counts);
        if pending.is_empty() && since.elapsed() >= quiet {
            info!(ms = started.elapsed().as_millis() as u64, waited_for = ?first, "settled: no pending work, effects unchanged");
            return Ok(None);
        }
        tokio::time::sleep(SETTLE_POLL).await;
        if !clock.running() {
            if pending.is_empty() {
                warn!("the effects were still changing when the settle ran out; judging them as they are");
                return Ok(None);
            }
            return Ok(Some(Stall { keys: pending, waited: started.elapsed(), why: clock.why() }));
        }
    }
}

/// The last fault that struck a component whose name starts with
/// `prefix`, or else the last of all, as the stall's last fault before.
fn last_fault(faults: &[crate::faults::FaultRecord], prefix: &str) -> String {
    let on = faults.iter().filter(|f| f.component.starts_with(prefix)).max_by_key(|f| f.at_ms);
    on.or_else(|| faults.iter().max_by_key(|f| f.at_ms))
        .map(|f| format!("{} on {} at {:.3} s", f.point, f.component, f.at_ms as f64 / 1000.0))
        .unwrap_or_else(|| "none fired".into())
}

/// A liveness anomaly: its headline example, then up to four keys.
fn stall_anomaly(
    kind: crate::domain::anomaly::AnomalyKind,
    count: u64,
    headline: String,
    keys: &[String],
    each: &str,
) -> crate::verifier::Anomaly {
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).filter(|k| !k.is_empty()).collect();
    keys.sort();
    keys.dedup();
    let mut examples = vec![headline];
    examples.extend(keys.iter().take(4).map(|k| format!("key {k}: {each}")));
    crate::verifier::Anomaly {
        name: kind.as_str().into(),
        count,
        examples,
        allowed: false,
        subjects: vec![],
        followed: vec![],
        found_by: vec![],
    }
}

/// The `stalled consumer` anomaly of a stall: how much was left, for how
/// long, which keys, and the last fault before it.
pub(super) fn stalled(stall: &Stall, faults: &[crate::faults::FaultRecord]) -> crate::verifier::Anomaly {
    let headline = format!(
        "{} rows of system.pending still there {:.1} s after the drain, not applied {}; the last fault before: {}",
        stall.keys.len(),
        stall.waited.as_secs_f64(),
        stall.why,
        last_fault(faults, "notifier")
    );
    let kind = crate::domain::anomaly::AnomalyKind::StalledConsumer;
    stall_anomaly(kind, stall.keys.len() as u64, headline, &stall.keys, "accepted, still pending")
}

/// The `stalled relay` anomaly: how many outbox rows were left, for how
/// long the drain waited, which keys, and the last fault before (a
/// relay's, when one was struck).
/// The relay's stall as the verifier found it: with a mark (a column, a
/// delete), every row left unmarked; without one, only the rows left
/// after the last one published (`unpublished leftover`). Rows skipped
/// while later ones went on to the topic are lost events, not a stall:
/// None when every unpublished row was skipped.
pub(super) fn left_by_the_relay(
    stall: &RelayStall,
    published: &Published,
    anomalies: &[crate::verifier::Anomaly],
) -> Option<RelayStall> {
    if *published != Published::None {
        return Some(stall.clone());
    }
    let leftover = crate::domain::anomaly::AnomalyKind::UnpublishedLeftover.as_str();
    let left = anomalies.iter().find(|a| a.name == leftover).map_or(0, |a| a.count as i64);
    (left > 0).then(|| RelayStall { left, ..stall.clone() })
}

pub(super) fn stalled_relay(stall: &RelayStall, faults: &[crate::faults::FaultRecord]) -> crate::verifier::Anomaly {
    let headline = format!(
        "{} outbox rows unpublished {:.1} s into the drain ({:.1} s of it fault-free); last fault before: {}",
        stall.left,
        stall.waited.as_secs_f64(),
        stall.fault_free.as_secs_f64(),
        last_fault(faults, "relay")
    );
    let kind = crate::domain::anomaly::AnomalyKind::StalledRelay;
    stall_anomaly(kind, stall.left.max(0) as u64, headline, &stall.keys, "written to the outbox, never published")
}

/// The two liveness invariants beside the verifier's: a stalled relay
/// breaks "no outbox row left unpublished" (its rows are the leftovers),
/// and a system that declares `pending` promises its accepted work is
/// applied before the run ends.
pub(super) fn liveness(
    invariants: &mut Vec<crate::verifier::Invariant>,
    sys: &System,
    consumer: Option<&Stall>,
    relay_stalled: bool,
) {
    use crate::domain::anomaly::AnomalyKind;
    if relay_stalled {
        if let Some(i) = invariants.iter_mut().find(|i| i.name == crate::verifier::declared::UNPUBLISHED_INVARIANT) {
            i.anomalies.push(AnomalyKind::StalledRelay.as_str().into());
        }
    }
    if sys.pending.is_some() {
        let left = consumer.map_or(0, |s| s.keys.len() as u64);
        let mut i = crate::verifier::Invariant::eq(PENDING_INVARIANT, 0, left);
        i.anomalies = vec![AnomalyKind::StalledConsumer.as_str().into()];
        invariants.push(i);
    }
}

/// The invariant of a system that declares its pending work.
const PENDING_INVARIANT: &str = "the accepted work (system.pending) is applied before the run ends";

#[cfg(test)]
mod tests {
    use super::*;

    fn anomaly(name: &str, count: u64) -> crate::verifier::Anomaly {
        crate::verifier::Anomaly {
            name: name.into(),
            count,
            examples: vec![],
            allowed: false,
            subjects: vec![],
            followed: vec![],
            found_by: vec![],
        }
    }

    /// Issue 63: with no mark, a row skipped while later ones were
    /// published is a lost event and no stall; the rows left after the
    /// last one published are. With a mark, every unmarked row is.
    #[test]
    fn a_skipped_row_is_lost_and_only_the_rows_left_after_the_last_are_a_stall() {
        let stall =
            RelayStall { left: 3, keys: vec![], waited: Duration::from_secs(30), fault_free: Duration::from_secs(15) };
        let skipped = [anomaly("lost event", 3)];
        assert!(left_by_the_relay(&stall, &Published::None, &skipped).is_none(), "skipped rows are no stall");
        let both = [anomaly("lost event", 1), anomaly("unpublished leftover", 2)];
        assert_eq!(left_by_the_relay(&stall, &Published::None, &both).map(|s| s.left), Some(2));
        let marked = Published::Column("published_at".into());
        assert_eq!(left_by_the_relay(&stall, &marked, &skipped).map(|s| s.left), Some(3), "a mark's rows all stall");
    }
}
