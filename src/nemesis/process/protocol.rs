//! The line protocol a component process speaks to the harness on stdout:
//! one JSON line each after [`PREFIX`]. The fault firings, their
//! confirmations, the events a relay crash awaits on the topic, the
//! batches a notifier received, its stops at crash and stall points, and
//! every 200 ms a snapshot of its counters and of the fault points it
//! reached. The process side is `chaos component`
//! ([`crate::harness::component`]); the harness's side is the keeper
//! ([`super::program`]), which folds the snapshots into the run's counters.

use crate::broker::{Position, Stretch};
use crate::context::{Coordination, Counts, Stats};
use crate::faults::{FaultInjector, FaultPoint, FaultRecord};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// What starts every protocol line on a component's stdout.
pub const PREFIX: &str = "chaos-component ";

/// The environment variable that carries the validated scenario, as JSON.
pub const SCENARIO_ENV: &str = "CHAOS_SCENARIO_JSON";
/// Set to the SQLite file in the embedded mode (then no database URL).
pub const SQLITE_ENV: &str = "CHAOS_SQLITE_PATH";
/// "1" when the broker is the embedded mock cluster.
pub const EMBEDDED_ENV: &str = "CHAOS_EMBEDDED";

/// One line of the protocol.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Fired {
        record: FaultRecord,
    },
    Confirmed {
        point: FaultPoint,
        n: u64,
    },
    Copies {
        point: FaultPoint,
        event: uuid::Uuid,
        copies: u8,
    },
    /// Stopped at a crash point: kill me. `fires`: the firings this one
    /// crash stands for (several events of one batch may fire).
    Halt {
        point: FaultPoint,
        fires: u64,
    },
    /// At a stall point: stop me for `ms`.
    Stall {
        point: FaultPoint,
        ms: u64,
    },
    Snapshot {
        snapshot: Snapshot,
    },
    /// A notifier received a batch: its size and the stretch of each lane
    /// it held (the anomalies' stories show each delivery).
    Delivered {
        component: String,
        messages: u32,
        spans: Vec<Stretch>,
    },
    /// A firing of `point` is confirmed by the next delivery of the message
    /// at `at`, to whichever process gets it: a replay the process may not
    /// live to read itself. On the line, `at` is written as the report
    /// writes a message's place.
    AwaitsDelivery {
        point: FaultPoint,
        #[serde(flatten)]
        at: Position,
    },
}

/// A component's cumulative figures since it started.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Every counter, by name.
    pub counters: Counts,
    /// Occurrences per fault point, in `FaultPoint::ALL` order.
    pub reached: Vec<u64>,
    /// First and last publish, first and last apply, as Unix milliseconds
    /// (0: none yet).
    pub marks_unix_ms: [u64; 4],
    /// The partitions a notifier holds after its latest rebalance: the
    /// run's group wait reads them (the mock cluster cannot list groups).
    #[serde(default)]
    pub assigned: Option<usize>,
}

/// The stage marks, in the order of `Snapshot::marks_unix_ms`.
pub fn marks(s: &Stats) -> [(&AtomicU64, bool); 4] {
    // (mark, is a "first" mark)
    [(&s.first_publish_ms, true), (&s.last_publish_ms, false), (&s.first_apply_ms, true), (&s.last_apply_ms, false)]
}

/// A component's figures now, for its next snapshot line.
pub fn snapshot(stats: &Stats, coord: &Coordination, faults: &FaultInjector) -> Snapshot {
    let origin = stats.origin_unix_ms;
    let marks = marks(stats).map(|(m, first)| match Stats::get(m) {
        u64::MAX => 0,
        0 if !first => 0,
        v => origin + v,
    });
    Snapshot {
        counters: stats.counts(),
        reached: FaultPoint::ALL.iter().map(|p| faults.reached(*p)).collect(),
        marks_unix_ms: marks,
        assigned: coord.assigned().values().next().copied(),
    }
}

/// The harness's side: folds one component's snapshots into the run's
/// counters, adding what changed since the last one.
#[derive(Default)]
pub struct Fold {
    last: Snapshot,
}

impl Fold {
    /// `slot`: the component's instance number, under which its
    /// assignment is kept.
    pub fn apply(&mut self, s: Snapshot, slot: usize, stats: &Stats, coord: &Coordination, faults: &FaultInjector) {
        if let Some(n) = s.assigned {
            coord.set_assigned(slot, n);
        }
        stats.add_since(&s.counters, &self.last.counters);
        for (i, p) in FaultPoint::ALL.iter().enumerate() {
            let (now, before) =
                (s.reached.get(i).copied().unwrap_or(0), self.last.reached.get(i).copied().unwrap_or(0));
            faults.add_reached(*p, now.saturating_sub(before));
        }
        for (i, (m, first)) in marks(stats).iter().enumerate() {
            let unix = s.marks_unix_ms[i];
            if unix == 0 || unix < stats.origin_unix_ms {
                continue;
            }
            let rel = unix - stats.origin_unix_ms;
            if *first {
                m.fetch_min(rel, Ordering::Relaxed);
            } else {
                m.fetch_max(rel, Ordering::Relaxed);
            }
        }
        self.last = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FaultRates;

    /// A component's snapshots are cumulative: folding two adds the first
    /// whole and then only what grew, counter by counter, each by its name,
    /// whichever counters the component moved.
    #[test]
    fn snapshots_fold_into_the_runs_counters_by_what_grew() {
        let (component, run) = (Stats::default(), Stats::default());
        let (coord, faults) = (Coordination::default(), FaultInjector::new(1, &FaultRates::none()));
        let mut fold = Fold::default();
        Stats::add(&run.relay_batches, 5);
        Stats::add(&component.relay_batches, 2);
        Stats::add(&component.purged_outbox_rows, 7);
        fold.apply(snapshot(&component, &coord, &faults), 1, &run, &coord, &faults);
        Stats::add(&component.relay_batches, 3);
        fold.apply(snapshot(&component, &coord, &faults), 1, &run, &coord, &faults);
        let counts = run.counts();
        assert_eq!((counts.relay_batches, counts.purged_outbox_rows, counts.notifier_crashes), (10, 7, 0));
    }
}
