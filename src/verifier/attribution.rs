//! Which faults came just before an anomaly: the verification's answer to
//! "what did this", as far as time can give it.
//!
//! An example of an anomaly is about one payment or one event (its
//! subject). Its *last trace* is the latest time the database recorded for
//! it: the payment's row written or captured, a receipt sent, the
//! projection set; the event marked published, or claimed in the inbox.
//! A duplicate receipt's last trace is the second receipt; a phantom
//! payment's, its row; a lost event's, its mark as published. The faults
//! that fired in the [`WINDOW_MS`] before that trace, or up to [`AFTER_MS`]
//! after it (a broker that acked a batch and died before its followers
//! copied it loses the batch after the relay's mark), are listed, nearest
//! first: the suspects, not a proof of cause. An example with no fault
//! around it says so, which is a finding too (a bug that needs no fault).
//!
//! The database's clock and the harness's are the same machine's, read
//! through `clock_timestamp()` (PostgreSQL) or `unixepoch('subsec')`
//! (SQLite): both in milliseconds since the epoch.

use super::Anomaly;
use crate::faults::FaultPoint;
use crate::faults::FaultRecord;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// How far before a trace a fault counts as a suspect.
pub const WINDOW_MS: u64 = 5_000;
/// How far after a trace a fault still counts: a loss can come after the
/// last write (a leader that dies after its ack).
pub const AFTER_MS: u64 = 2_000;
/// At most this many suspects per example.
pub const SUSPECTS: usize = 3;

/// One example's last trace and the faults before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followed {
    /// Index into the anomaly's `examples`.
    pub example: usize,
    pub subject: Uuid,
    /// The last trace, in milliseconds since the run started.
    pub trace_ms: u64,
    /// Nearest first.
    pub faults: Vec<Suspect>,
}

impl Followed {
    /// Its suspects as text, one per `sep`: "relay.after_produce on relay-1,
    /// 12 ms before", or a line saying none fired around it.
    pub fn suspects(&self, sep: &str) -> String {
        if self.faults.is_empty() {
            return "none: no fault fired around it".to_string();
        }
        self.faults
            .iter()
            .map(|s| match s.before_ms {
                b if b >= 0 => format!("{} on {}, {b} ms before", s.point, s.component),
                a => format!("{} on {}, {} ms after", s.point, s.component, -a),
            })
            .collect::<Vec<_>>()
            .join(sep)
    }
}

/// A fault that fired shortly before a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    pub point: String,
    pub component: String,
    pub at_ms: u64,
    /// How long before the trace it fired; negative: after it.
    pub before_ms: i64,
    pub hit: String,
}

/// Fills each anomaly's `followed` from the last traces of its examples'
/// subjects (epoch milliseconds, per subject), the run's start (epoch
/// milliseconds) and its fault log.
///
/// A fault with a length (`spans`: a pause, a blackhole, a timeline entry's
/// `for`, by point name) covers its whole span: a zombie paused for 8 s that
/// writes when it wakes is a suspect of what it wrote, though its firing
/// was logged 8 s before.
pub fn attribute(
    anomalies: &mut [Anomaly],
    traces: &HashMap<Uuid, i64>,
    run_started_ms: i64,
    log: &[FaultRecord],
    spans: &BTreeMap<String, u64>,
) {
    for a in anomalies.iter_mut() {
        a.followed = a
            .subjects
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .filter_map(|(example, subject)| {
                let trace_ms = u64::try_from(traces.get(&subject)? - run_started_ms).ok()?;
                let mut faults: Vec<Suspect> = log
                    .iter()
                    .filter(|f| {
                        let lasts = spans.get(&f.point).copied().unwrap_or(0);
                        f.at_ms + lasts + WINDOW_MS >= trace_ms && f.at_ms <= trace_ms + AFTER_MS
                    })
                    .map(|f| Suspect {
                        point: f.point.clone(),
                        component: f.component.clone(),
                        at_ms: f.at_ms,
                        before_ms: trace_ms as i64 - f.at_ms as i64,
                        hit: f.hit.clone(),
                    })
                    .collect();
                // Nearest first; a trace inside a fault's span is nearest of all.
                let distance = |f: &Suspect| {
                    let lasts = spans.get(&f.point).copied().unwrap_or(0) as i64;
                    match f.before_ms {
                        b if b >= 0 && b <= lasts => 0,
                        b if b > lasts => (b - lasts) as u64,
                        a => a.unsigned_abs(),
                    }
                };
                faults.sort_by_key(distance);
                faults.truncate(SUSPECTS);
                Some(Followed { example, subject, trace_ms, faults })
            })
            .collect();
    }
}

/// How long each fault with a length lasts, by point name: the timeline's
/// `for` (its first entry per fault point) and a pause's length. The chart
/// draws them as bands; attribution counts a fault across its span.
pub fn spans(sc: &Scenario) -> BTreeMap<String, u64> {
    let mut spans = BTreeMap::new();
    for t in &sc.timeline {
        spans.entry(t.point.name().to_string()).or_insert(t.lasts.as_millis() as u64);
    }
    if sc.faults.get(FaultPoint::ProcessPause) > 0.0 {
        spans.insert(FaultPoint::ProcessPause.name().to_string(), sc.pause.as_millis() as u64);
    }
    spans
}

/// The subjects whose traces to look up: those of the violations' examples.
pub fn subjects(anomalies: &[Anomaly]) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = anomalies.iter().flat_map(|a| a.subjects.iter().flatten().copied()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(point: &str, component: &str, at_ms: u64) -> FaultRecord {
        FaultRecord { point: point.into(), component: component.into(), at_ms, hit: "x".into(), occurrence: None }
    }

    #[test]
    fn the_faults_just_before_a_trace_are_its_suspects_nearest_first() {
        let (p, q, r) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let mut anomalies = vec![Anomaly {
            name: "duplicate effect".into(),
            count: 3,
            examples: vec!["p".into(), "q".into(), "no subject".into(), "r".into()],
            allowed: false,
            subjects: vec![Some(p), Some(q), None, Some(r)],
            followed: vec![],
        }];
        let log = vec![
            fault("net.reset", "relay-1", 1_000),
            fault("db.commit_ack_lost", "notifier-2", 9_000),
            fault("relay.after_produce", "relay-2", 9_500),
            fault("net.blackhole", "notifier-1", 12_200),
            fault("kafka.produce_ack_lost", "relay-1", 20_000),
        ];
        // Run started at epoch 1,000,000 ms; p last seen at run time 10 s,
        // q at 30 s, r never (its traces were not found).
        let traces = HashMap::from([(p, 1_010_000), (q, 1_030_000)]);
        attribute(&mut anomalies, &traces, 1_000_000, &log, &BTreeMap::new());
        let f = &anomalies[0].followed;
        assert_eq!(f.len(), 2, "one per example with a subject and a trace: {f:?}");
        assert_eq!((f[0].example, f[0].trace_ms), (0, 10_000));
        let points: Vec<(&str, i64)> = f[0].faults.iter().map(|s| (s.point.as_str(), s.before_ms)).collect();
        // The blackhole came 2.2 s after the trace, the reset 9 s before it: out.
        assert_eq!(points, vec![("relay.after_produce", 500), ("db.commit_ack_lost", 1_000)]);
        assert_eq!(f[1].example, 1);
        assert!(f[1].faults.is_empty(), "nothing in the 5 s before 30 s: {:?}", f[1].faults);
        assert_eq!(subjects(&anomalies), vec![p, q, r]);
    }

    #[test]
    fn a_fault_soon_after_a_trace_is_a_suspect_too() {
        let p = Uuid::from_u128(9);
        let mut anomalies = vec![Anomaly {
            name: "lost event".into(),
            count: 1,
            examples: vec!["p".into()],
            allowed: false,
            subjects: vec![Some(p)],
            followed: vec![],
        }];
        // Marked published at 10 s; the leader killed 300 ms later.
        let log = vec![fault("broker.kill_leader", "the leader", 10_300), fault("net.reset", "relay-1", 13_000)];
        attribute(&mut anomalies, &HashMap::from([(p, 10_000)]), 0, &log, &BTreeMap::new());
        let s = &anomalies[0].followed[0].faults;
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].point.as_str(), s[0].before_ms), ("broker.kill_leader", -300));
    }

    #[test]
    fn at_most_three_suspects_and_none_from_before_the_run() {
        let p = Uuid::from_u128(7);
        let mut anomalies = vec![Anomaly {
            name: "phantom payment".into(),
            count: 1,
            examples: vec!["p".into()],
            allowed: false,
            subjects: vec![Some(p)],
            followed: vec![],
        }];
        let log: Vec<FaultRecord> = (0..10).map(|i| fault("net.reset", "workload", 4_000 + i * 100)).collect();
        attribute(&mut anomalies, &HashMap::from([(p, 5_000)]), 0, &log, &BTreeMap::new());
        let s = &anomalies[0].followed[0].faults;
        assert_eq!(s.iter().map(|s| s.at_ms).collect::<Vec<_>>(), vec![4_900, 4_800, 4_700]);
        // A trace from before the run started (a clock step) dates nothing.
        attribute(&mut anomalies, &HashMap::from([(p, -5)]), 0, &log, &BTreeMap::new());
        assert!(anomalies[0].followed.is_empty());
    }

    #[test]
    fn a_fault_with_a_length_covers_its_whole_span() {
        // A zombie paused at 1.057 s for 8 s writes a duplicate at 9.1 s.
        let p = Uuid::from_u128(7);
        let mut anomalies = vec![Anomaly {
            name: "duplicate effect".into(),
            count: 1,
            examples: vec!["x".into()],
            allowed: false,
            subjects: vec![Some(p)],
            followed: vec![],
        }];
        let log = [fault("process.pause", "notifier-1", 1_057), fault("relay.after_produce", "relay-1", 8_000)];
        let traces = HashMap::from([(p, 9_100)]);
        attribute(&mut anomalies, &traces, 0, &log, &BTreeMap::new());
        let seen: Vec<&str> = anomalies[0].followed[0].faults.iter().map(|f| f.point.as_str()).collect();
        assert_eq!(seen, ["relay.after_produce"], "without its length the pause is out of the window");
        let spans = BTreeMap::from([("process.pause".to_string(), 8_000)]);
        attribute(&mut anomalies, &traces, 0, &log, &spans);
        let seen: Vec<&str> = anomalies[0].followed[0].faults.iter().map(|f| f.point.as_str()).collect();
        assert_eq!(seen, ["process.pause", "relay.after_produce"], "the pause covers the trace, nearest of all");
    }
}
