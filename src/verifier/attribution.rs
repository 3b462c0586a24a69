//! Which fault caused an anomaly: matched through the data the fault log
//! records, and by time when the data says nothing.
//!
//! An example of an anomaly is about one payment or one event (its
//! subject). Its *footprint* is what its story holds
//! ([`super::story`]): its outbox rows' seqs and its messages' positions
//! on the topic. A firing's *reach* is what the component that struck it
//! logged ([`crate::faults::Reach`]): a relay's batch of outbox seqs, a
//! notifier's batch of topic positions. A firing whose reach holds the
//! example's footprint is a cause *by data*: a relay that crashed after
//! producing the batch that held event seq 7 put the second copy of seq 7
//! on the topic. A signal to a process carries no reach; when that
//! process reported its deliveries, the batch it last received before the
//! signal stands for it.
//!
//! Without a data match, time is the fallback, and is marked as such. The
//! example's *last trace* is the latest time the database recorded for it:
//! the payment's row written or captured, a receipt sent, the projection
//! set; the event marked published, or claimed in the inbox. A duplicate
//! receipt's last trace is the second receipt; a phantom payment's, its
//! row; a lost event's, its mark as published. The faults that fired in
//! the [`WINDOW_MS`] before that trace, or up to [`AFTER_MS`] after it (a
//! broker that acked a batch and died before its followers copied it loses
//! the batch after the relay's mark), are suspects *by time*, nearest
//! first: not a proof of cause. An example with no fault around it says
//! so, which is a finding too (a bug that needs no fault).
//!
//! The database's clock and the harness's are the same machine's, read
//! through `clock_timestamp()` (PostgreSQL) or `unixepoch('subsec')`
//! (SQLite): both in milliseconds since the epoch.

use super::story::Story;
use super::Anomaly;
use crate::broker::{range, Position};
use crate::faults::FaultPoint;
use crate::faults::{DeliveryRecord, FaultRecord};
use crate::scenario::Scenario;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// How far before a trace a fault counts as a suspect by time.
pub const WINDOW_MS: u64 = 5_000;
/// How far after a trace a fault still counts: a loss can come after the
/// last write (a leader that dies after its ack).
pub const AFTER_MS: u64 = 2_000;
/// At most this many suspects per example.
pub const SUSPECTS: usize = 3;

/// One example's last trace and the faults that caused it, or came near it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Followed {
    /// Index into the anomaly's `examples`.
    pub example: usize,
    /// What the example is about: a payment's or an event's id, or a
    /// declared system's key.
    pub subject: String,
    /// The last trace, in milliseconds since the run started.
    pub trace_ms: u64,
    /// Matched by data first, then by time; nearest first within each.
    pub faults: Vec<Suspect>,
}

impl Followed {
    /// Its suspects as text, one per `sep`: "relay.after_produce on relay-2
    /// at 1.097 s: its batch (outbox seq 5..=32) held seq 7", or "by time:
    /// net.reset on relay-1, 12 ms before", or a line saying none fired
    /// around it.
    pub fn suspects(&self, sep: &str) -> String {
        if self.faults.is_empty() {
            return "none: no fault fired around it".to_string();
        }
        self.faults.iter().map(Suspect::describe).collect::<Vec<_>>().join(sep)
    }

    /// The cause matched by data, if any.
    pub fn cause(&self) -> Option<&Suspect> {
        self.faults.first().filter(|s| s.by == By::Data)
    }
}

/// How a suspect was tied to its example.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The firing's reach held the example's event or message.
    Data,
    /// Only nearness in time: a suspect, not a proof.
    #[default]
    Time,
}

/// A fault tied to an example, by data or by time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Suspect {
    pub point: String,
    pub component: String,
    pub at_ms: u64,
    /// How long before the trace it fired; negative: after it.
    pub before_ms: i64,
    pub hit: String,
    #[serde(default)]
    pub by: By,
    /// For a match by data, what matched: "its batch (outbox seq 5..=32)
    /// held seq 7".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<String>,
}

impl Suspect {
    /// A firing as a suspect of an example whose last trace was at
    /// `trace_ms` (since the run started).
    pub fn of(f: &FaultRecord, trace_ms: u64, by: By, matched: Option<String>) -> Self {
        Suspect {
            point: f.point.clone(),
            component: f.component.clone(),
            at_ms: f.at_ms,
            before_ms: trace_ms as i64 - f.at_ms as i64,
            hit: f.hit.clone(),
            by,
            matched,
        }
    }

    pub fn describe(&self) -> String {
        match (&self.by, &self.matched) {
            (By::Data, Some(m)) => {
                format!("{} on {} at {:.3} s: {m}", self.point, self.component, self.at_ms as f64 / 1000.0)
            }
            _ => match self.before_ms {
                b if b >= 0 => format!("by time: {} on {}, {b} ms before", self.point, self.component),
                a => format!("by time: {} on {}, {} ms after", self.point, self.component, -a),
            },
        }
    }
}

/// What the verifier knows of the faults and of the anomalies' subjects.
#[derive(Clone, Copy)]
pub struct Evidence<'a> {
    /// Each subject's last trace, in epoch milliseconds.
    pub traces: &'a HashMap<Uuid, i64>,
    /// The run's start, in epoch milliseconds.
    pub run_started_ms: i64,
    pub log: &'a [FaultRecord],
    /// A fault with a length (`spans`: a pause, a blackhole, a timeline
    /// entry's `for`, by point name) covers its whole span: a zombie paused
    /// for 8 s that writes when it wakes is a suspect of what it wrote,
    /// though its firing was logged 8 s before.
    pub spans: &'a BTreeMap<String, u64>,
    /// The examples' stories: their footprints.
    pub stories: &'a [Story],
    /// The batches the notifiers reported receiving.
    pub deliveries: &'a [DeliveryRecord],
}

/// Fills each anomaly's `followed`.
pub fn attribute(anomalies: &mut [Anomaly], ev: &Evidence) {
    for a in anomalies.iter_mut() {
        let name = a.name.clone();
        a.followed = a
            .subjects
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .filter_map(|(example, subject)| {
                let trace_ms = u64::try_from(ev.traces.get(&subject)? - ev.run_started_ms).ok()?;
                let story = ev.stories.iter().find(|s| s.anomaly == name && s.example == example);
                // A cause comes before its effect, or soon after its last
                // trace (a loss after the mark); a kill that makes a
                // message come back comes before the effect it repeats,
                // never after.
                let faults = suspects(ev.log, trace_ms, &name, ev.spans, |f| {
                    let m = story.and_then(|s| matched(f, s, ev.deliveries))?;
                    let after = match FaultPoint::from_name(&f.point) {
                        Some(FaultPoint::DbKillAfterCommit) => 0,
                        _ => AFTER_MS,
                    };
                    (f.at_ms <= trace_ms + after).then_some(m)
                });
                Some(Followed { example, subject: subject.to_string(), trace_ms, faults })
            })
            .collect();
    }
}

/// The one attribution every checker uses: the firings of `log` tied to
/// an example of `anomaly` whose last trace was at `trace_ms`. By data
/// first: `by_data` says what of the example a firing's reach held. Time
/// is only the fallback: with a cause matched by data, what merely came
/// near it is left out. A firing that reached the data but cannot cause
/// this anomaly is no cause: alone, it is judged by time like any other.
/// At most [`SUSPECTS`], the likeliest first.
pub fn suspects(
    log: &[FaultRecord],
    trace_ms: u64,
    anomaly: &str,
    spans: &BTreeMap<String, u64>,
    by_data: impl Fn(&FaultRecord) -> Option<String>,
) -> Vec<Suspect> {
    let mut data: Vec<Suspect> =
        log.iter().filter_map(|f| by_data(f).map(|m| Suspect::of(f, trace_ms, By::Data, Some(m)))).collect();
    let mut faults = if data.iter().any(|f| can_cause(&f.point, anomaly)) {
        latest_redelivery(&mut data);
        // One that cannot cause it goes last; then earliest first: a cause
        // comes before what it causes, and a later firing on the same data
        // (the batch's republish, its redelivery) is its consequence.
        data.sort_by_key(|f| (!can_cause(&f.point, anomaly), f.at_ms));
        data
    } else {
        let lasts = |f: &str| spans.get(f).copied().unwrap_or(0);
        let mut near: Vec<Suspect> = log
            .iter()
            .filter(|f| f.at_ms + lasts(&f.point) + WINDOW_MS >= trace_ms && f.at_ms <= trace_ms + AFTER_MS)
            .map(|f| Suspect::of(f, trace_ms, By::Time, None))
            .collect();
        // Nearest first; a trace inside a fault's span is nearest of all.
        near.sort_by_key(|f| match f.before_ms {
            b if b >= 0 && b <= lasts(&f.point) as i64 => 0,
            b if b > lasts(&f.point) as i64 => (b - lasts(&f.point) as i64) as u64,
            a => a.unsigned_abs(),
        });
        near
    };
    faults.truncate(SUSPECTS);
    faults
}

/// Whether a firing of `point` can cause an anomaly called `anomaly` in
/// any program. Two relay points touch a batch without repeating or losing
/// any of it: a crash after the mark (everything of the batch is done) and
/// a slow produce, which only reorders (so it can cause a stale
/// projection, and nothing else); a kill after an offset commit cannot
/// make what it covered happen twice. Matched by data, they are still
/// listed, after the firings that can.
pub fn can_cause(point: &str, anomaly: &str) -> bool {
    use crate::domain::anomaly::AnomalyKind;
    match FaultPoint::from_name(point) {
        Some(FaultPoint::RelayAfterMark) => false,
        // A batch published again: a message twice, never one less. A
        // loss downstream of it is some other fault's, or the program's
        // own (an email client that drops one was blamed on it).
        Some(FaultPoint::RelayAfterProduce) => !matches!(
            AnomalyKind::parse(anomaly),
            Some(
                AnomalyKind::LostPayment
                    | AnomalyKind::LostEvent
                    | AnomalyKind::MissingEffect
                    | AnomalyKind::MissingExternalEffect
                    | AnomalyKind::LostOperation
            )
        ),
        // What a commit covered was done, or lost if it came first: never
        // done twice.
        Some(FaultPoint::KafkaKillAfterOffsetCommit) => !anomaly.starts_with("duplicate"),
        Some(FaultPoint::RelaySlowProduce) => anomaly == crate::domain::anomaly::AnomalyKind::StaleProjection.as_str(),
        _ => true,
    }
}

/// What of an example's footprint a firing reached, in words; None when
/// nothing did.
fn matched(f: &FaultRecord, story: &Story, deliveries: &[DeliveryRecord]) -> Option<String> {
    let r = &f.reach;
    if let Some((seq, (a, b))) = story.seqs.iter().find_map(|s| r.seq_run(*s).map(|run| (*s, run))) {
        return Some(format!("its batch (outbox seq {}) held seq {seq}", range(a, b)));
    }
    let positions: Vec<Position> = story.messages.iter().map(|m| m.at).collect();
    if let Some(m) = reached(f, &positions, &story.anomaly) {
        return Some(m);
    }
    // A notifier that crashes gets back all it had not committed, not only
    // the batch it crashed in: its earlier batches' offset commits are
    // asynchronous, and on a busy machine they may not have landed. So a
    // message it received before the crash and that was delivered again
    // after it came back through the crash.
    if redelivers(&f.point) {
        let came_back = |m: &&crate::verifier::story::TopicMessage| {
            let held = deliveries.iter().rfind(|d| d.component == f.component && d.at_ms <= f.at_ms && d.covers(m.at));
            let again = deliveries.iter().find(|d| d.at_ms >= f.at_ms && d.covers(m.at));
            held.zip(again)
        };
        if let Some((m, (held, again))) = story.messages.iter().find_map(|m| came_back(&m).map(|d| (m, d))) {
            return Some(format!(
                "it crashed holding message {} uncommitted (received at {:.3} s, delivered again at {:.3} s)",
                m.at,
                held.at_ms as f64 / 1000.0,
                again.at_ms as f64 / 1000.0
            ));
        }
    }
    // A signal to a process reaches what the process held: the batch it
    // last received before the signal, when it reported its deliveries.
    let signalled = FaultPoint::from_name(&f.point).is_some_and(|p| p.needs_process());
    if !signalled || !r.is_empty() {
        return None;
    }
    let last = deliveries.iter().rfind(|d| d.component == f.component && d.at_ms <= f.at_ms)?;
    let m = story.messages.iter().find(|m| last.covers(m.at))?;
    Some(format!(
        "the batch it last received before it ({} messages, at {:.3} s) held message {}",
        last.messages,
        last.at_ms as f64 / 1000.0,
        m.at
    ))
}

/// What of `messages` (their positions) a firing's reach holds, in
/// words, when that can explain `anomaly`; None otherwise. An offset
/// commit's reach is what it covered (never delivered again, so lost if
/// not done: no duplicate); a kill after a database commit's, what its
/// process had fetched past the group's position (delivered again after
/// the kill, so done twice if it was done: a duplicate, never a loss); any
/// other's, the batch it struck.
pub fn reached(f: &FaultRecord, messages: &[Position], anomaly: &str) -> Option<String> {
    let point = FaultPoint::from_name(&f.point);
    if point == Some(FaultPoint::DbKillAfterCommit) && !anomaly.starts_with("duplicate") {
        return None;
    }
    let (message, stretch) = messages.iter().find_map(|&m| f.reach.span_of(m).map(|s| (m, s)))?;
    Some(match point {
        Some(FaultPoint::KafkaKillAfterOffsetCommit) => {
            format!("its offset commit ({stretch}) covered message {message}")
        }
        Some(FaultPoint::DbKillAfterCommit) => format!(
            "its process had fetched {stretch}, past the group's committed position: message {message} was \
             delivered again"
        ),
        _ => format!("its batch ({stretch}) held message {message}"),
    })
}

/// Of the kills after a database commit matched by data (each reached a
/// message its process had fetched and the group had not committed), only
/// the latest is kept. A message is fetched ahead of its processing, so a
/// kill before it was first applied also reaches it; the kill that made it
/// come back once it had been applied is the last one to reach it: any
/// later one would find it committed.
pub fn latest_redelivery(suspects: &mut Vec<Suspect>) {
    let redelivers = |s: &Suspect| FaultPoint::from_name(&s.point) == Some(FaultPoint::DbKillAfterCommit);
    if let Some(latest) = suspects.iter().filter(|s| redelivers(s)).map(|s| s.at_ms).max() {
        suspects.retain(|s| !redelivers(s) || s.at_ms == latest);
    }
}

/// A reference notifier's crash points: the group delivers again whatever
/// the crashed incarnation had not committed.
fn redelivers(point: &str) -> bool {
    matches!(
        FaultPoint::from_name(point),
        Some(
            FaultPoint::NotifierBeforeOffsetCommit
                | FaultPoint::NotifierMidBatch
                | FaultPoint::NotifierAfterExternalCall
        )
    )
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

    /// The evidence of a run that started at 0 and reported no deliveries.
    fn evidence<'a>(
        traces: &'a HashMap<Uuid, i64>,
        log: &'a [FaultRecord],
        spans: &'a BTreeMap<String, u64>,
        stories: &'a [Story],
    ) -> Evidence<'a> {
        Evidence { traces, run_started_ms: 0, log, spans, stories, deliveries: &[] }
    }
    use crate::faults::Reach;
    use crate::verifier::story::TopicMessage;

    fn fault(point: &str, component: &str, at_ms: u64) -> FaultRecord {
        FaultRecord {
            point: point.into(),
            component: component.into(),
            at_ms,
            hit: "x".into(),
            occurrence: None,
            reach: Reach::default(),
        }
    }

    /// Attribution with no story and no delivery: time alone.
    fn by_time(
        anomalies: &mut [Anomaly],
        traces: &HashMap<Uuid, i64>,
        run_started_ms: i64,
        log: &[FaultRecord],
        spans: &BTreeMap<String, u64>,
    ) {
        attribute(anomalies, &Evidence { traces, run_started_ms, log, spans, stories: &[], deliveries: &[] });
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
            found_by: vec![],
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
        by_time(&mut anomalies, &traces, 1_000_000, &log, &BTreeMap::new());
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
            found_by: vec![],
        }];
        // Marked published at 10 s; the leader killed 300 ms later.
        let log = vec![fault("broker.kill_leader", "the leader", 10_300), fault("net.reset", "relay-1", 13_000)];
        by_time(&mut anomalies, &HashMap::from([(p, 10_000)]), 0, &log, &BTreeMap::new());
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
            found_by: vec![],
        }];
        let log: Vec<FaultRecord> = (0..10).map(|i| fault("net.reset", "workload", 4_000 + i * 100)).collect();
        by_time(&mut anomalies, &HashMap::from([(p, 5_000)]), 0, &log, &BTreeMap::new());
        let s = &anomalies[0].followed[0].faults;
        assert_eq!(s.iter().map(|s| s.at_ms).collect::<Vec<_>>(), vec![4_900, 4_800, 4_700]);
        // A trace from before the run started (a clock step) dates nothing.
        by_time(&mut anomalies, &HashMap::from([(p, -5)]), 0, &log, &BTreeMap::new());
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
            found_by: vec![],
        }];
        let log = [fault("process.pause", "notifier-1", 1_057), fault("relay.after_produce", "relay-1", 8_000)];
        let traces = HashMap::from([(p, 9_100)]);
        by_time(&mut anomalies, &traces, 0, &log, &BTreeMap::new());
        let seen: Vec<&str> = anomalies[0].followed[0].faults.iter().map(|f| f.point.as_str()).collect();
        assert_eq!(seen, ["relay.after_produce"], "without its length the pause is out of the window");
        let spans = BTreeMap::from([("process.pause".to_string(), 8_000)]);
        by_time(&mut anomalies, &traces, 0, &log, &spans);
        let seen: Vec<&str> = anomalies[0].followed[0].faults.iter().map(|f| f.point.as_str()).collect();
        assert_eq!(seen, ["process.pause", "relay.after_produce"], "the pause covers the trace, nearest of all");
    }

    fn story_of(anomaly: &str, subject: Uuid, seqs: Vec<i64>, messages: Vec<(i32, i64)>) -> Story {
        Story {
            anomaly: anomaly.into(),
            example: 0,
            subject,
            payment: subject,
            steps: vec![],
            messages: messages.into_iter().map(|(p, o)| TopicMessage::new((p, o).into(), None)).collect(),
            seqs,
        }
    }

    fn one(name: &str, p: Uuid) -> Vec<Anomaly> {
        vec![Anomaly {
            name: name.into(),
            count: 1,
            examples: vec!["p".into()],
            allowed: false,
            subjects: vec![Some(p)],
            followed: vec![],
            found_by: vec![],
        }]
    }

    #[test]
    fn the_fault_whose_batch_held_the_event_is_named_first_over_nearer_ones() {
        // The case a newcomer met: a duplicate receipt whose event (seq 7)
        // sat in relay-2's batch 5..=32, crashed at 1.097 s; the faults
        // nearest in time to the second receipt hit other batches.
        let p = Uuid::from_u128(1);
        let mut anomalies = one("duplicate effect", p);
        let mut crash = fault("relay.after_produce", "relay-2", 1_097);
        crash.reach = Reach::outbox((5..=32).filter(|s| *s != 9));
        let mut near = fault("notifier.before_offset_commit", "notifier-1", 2_990);
        near.reach = Reach::topic([(0, 100), (0, 101)].map(Position::from));
        let mut other = fault("relay.after_produce", "relay-1", 2_950);
        other.reach = Reach::outbox(40..=60);
        let log = [crash, other, near];
        let stories = [story_of("duplicate effect", p, vec![7, 8], vec![(1, 3), (1, 40)])];
        let traces = HashMap::from([(p, 3_000)]);
        let spans = BTreeMap::new();
        let ev = evidence(&traces, &log, &spans, &stories);
        attribute(&mut anomalies, &ev);
        let f = &anomalies[0].followed[0];
        let first = f.cause().expect("a cause matched by data");
        assert_eq!((first.point.as_str(), first.component.as_str()), ("relay.after_produce", "relay-2"));
        assert_eq!(first.matched.as_deref(), Some("its batch (outbox seq 5..=8) held seq 7"));
        assert_eq!(f.faults.len(), 1, "what only came near in time is left out: {f:?}");
        assert_eq!(
            f.suspects("; "),
            "relay.after_produce on relay-2 at 1.097 s: its batch (outbox seq 5..=8) held seq 7"
        );
        // Without the story, time is all there is: the nearest first, so
        // marked.
        let ev = Evidence { stories: &[], ..ev };
        attribute(&mut anomalies, &ev);
        let f = &anomalies[0].followed[0];
        assert!(f.cause().is_none());
        let by_time: Vec<(&str, By)> = f.faults.iter().map(|s| (s.component.as_str(), s.by)).collect();
        assert_eq!(by_time, [("notifier-1", By::Time), ("relay-1", By::Time), ("relay-2", By::Time)]);
        assert!(f.suspects("; ").starts_with("by time: notifier.before_offset_commit on notifier-1, 10 ms before"));
    }

    #[test]
    fn among_causes_by_data_the_earliest_comes_first() {
        // A batch crashed after its produce, then republished by a relay
        // that crashed after its mark (harmless): the first touch is the
        // cause, the republish its consequence.
        let p = Uuid::from_u128(4);
        let mut anomalies = one("duplicate effect", p);
        let mut crash = fault("relay.after_produce", "relay-1", 1_000);
        crash.reach = Reach::outbox(1..=10);
        let mut republish = fault("relay.after_mark", "relay-2", 1_400);
        republish.reach = Reach::outbox(1..=10);
        let log = [republish, crash];
        let stories = [story_of("duplicate effect", p, vec![3], vec![])];
        let traces = HashMap::from([(p, 1_600)]);
        let spans = BTreeMap::new();
        let ev = evidence(&traces, &log, &spans, &stories);
        attribute(&mut anomalies, &ev);
        let seen: Vec<&str> = anomalies[0].followed[0].faults.iter().map(|f| f.point.as_str()).collect();
        assert_eq!(seen, ["relay.after_produce", "relay.after_mark"]);
    }

    /// A batch published again reaches the seq of a payment whose email
    /// went missing: it reached the data, but a republish adds a message,
    /// it never takes one away. Alone, it is no cause: the example is
    /// judged by time, and the same firing still causes a duplicate.
    #[test]
    fn a_republish_is_never_the_cause_of_a_loss() {
        let p = Uuid::from_u128(6);
        let mut crash = fault("relay.after_produce", "relay-1", 1_000);
        crash.reach = Reach::outbox(1..=10);
        let log = [crash];
        let traces = HashMap::from([(p, 1_600)]);
        let spans = BTreeMap::new();
        let judged = |anomaly: &str| {
            let mut anomalies = one(anomaly, p);
            let stories = [story_of(anomaly, p, vec![3], vec![])];
            let ev = evidence(&traces, &log, &spans, &stories);
            attribute(&mut anomalies, &ev);
            anomalies[0].followed[0].clone()
        };
        let lost = judged("missing external effect");
        assert!(lost.cause().is_none(), "{lost:?}");
        assert_eq!(lost.faults.len(), 1, "still a suspect by time: {lost:?}");
        assert_eq!((lost.faults[0].by, lost.faults[0].matched.as_deref()), (By::Time, None));
        let twice = judged("duplicate effect");
        assert_eq!(twice.cause().map(|c| c.point.as_str()), Some("relay.after_produce"));
        for loss in ["missing effect", "lost event", "lost payment", "lost operation"] {
            assert!(!can_cause("relay.after_produce", loss), "{loss}");
        }
    }

    #[test]
    fn a_firing_that_cannot_cause_the_anomaly_comes_after_one_that_can() {
        // A payment's authorized event in a batch that crashed after its
        // mark (harmless), its captured event in one that crashed after
        // its produce: the second receipt is the latter's.
        let p = Uuid::from_u128(5);
        let mut anomalies = one("duplicate effect", p);
        let mut harmless = fault("relay.after_mark", "relay-1", 256);
        harmless.reach = Reach::outbox(33..=82);
        let mut crash = fault("relay.after_produce", "relay-2", 298);
        crash.reach = Reach::outbox(83..=132);
        let log = [harmless, crash];
        let stories = [story_of("duplicate effect", p, vec![65, 83], vec![])];
        let traces = HashMap::from([(p, 392)]);
        let spans = BTreeMap::new();
        let ev = evidence(&traces, &log, &spans, &stories);
        attribute(&mut anomalies, &ev);
        let seen: Vec<&str> = anomalies[0].followed[0].faults.iter().map(|f| f.point.as_str()).collect();
        assert_eq!(seen, ["relay.after_produce", "relay.after_mark"]);
        assert!(
            can_cause("relay.slow_produce", "stale projection") && !can_cause("relay.slow_produce", "duplicate effect")
        );
        // A kill after an offset commit loses what it covered, when the
        // commit came first; it never makes it happen twice.
        let commit = "kafka.kill_after_offset_commit";
        assert!(can_cause(commit, "missing effect") && !can_cause(commit, "duplicate effect"));
        assert!(!can_cause(commit, "duplicate receipt") && !can_cause(commit, "duplicate external effect"));
    }

    #[test]
    fn a_notifier_batch_that_held_the_message_is_its_cause_and_a_later_one_is_not() {
        let p = Uuid::from_u128(2);
        let mut anomalies = one("duplicate effect", p);
        let mut early = fault("notifier.mid_batch", "notifier-2", 500);
        early.reach = Reach::topic([(1, 10), (1, 20), (2, 4)].map(Position::from));
        // The same message in a batch long after the trace: no cause.
        let mut late = fault("notifier.mid_batch", "notifier-1", 20_000);
        late.reach = Reach::topic([(1, 15)].map(Position::from));
        let log = [late, early];
        let stories = [story_of("duplicate effect", p, vec![], vec![(1, 15)])];
        let traces = HashMap::from([(p, 9_000)]);
        let spans = BTreeMap::new();
        let ev = evidence(&traces, &log, &spans, &stories);
        attribute(&mut anomalies, &ev);
        let f = &anomalies[0].followed[0];
        assert_eq!(f.faults.len(), 1, "{f:?}");
        assert_eq!(f.cause().map(|c| c.component.as_str()), Some("notifier-2"));
        assert_eq!(f.faults[0].matched.as_deref(), Some("its batch (partition 1, offsets 10..=20) held message 1:15"));
    }

    /// The crash's own batch did not hold the message; an earlier batch of
    /// the same incarnation did, whose offsets were not yet committed, and
    /// the message was delivered again after the crash.
    #[test]
    fn a_notifier_crash_reaches_what_it_received_and_had_not_committed() {
        let p = Uuid::from_u128(4);
        let mut anomalies = one("duplicate effect", p);
        let delivery =
            |component: &str, at_ms, spans| DeliveryRecord { component: component.into(), at_ms, messages: 5, spans };
        let deliveries = [
            delivery("notifier-1", 1_000, vec![(2, 10, 14).into()]),
            delivery("notifier-1", 1_100, vec![(2, 15, 19).into()]),
            delivery("notifier-1", 1_400, vec![(2, 10, 19).into()]),
        ];
        let mut crash = fault("notifier.before_offset_commit", "notifier-1", 1_150);
        crash.reach = Reach::topic([(2, 15), (2, 19)].map(Position::from));
        // Another notifier's crash, which never held the message.
        let mut other = fault("notifier.before_offset_commit", "notifier-2", 1_120);
        other.reach = Reach::topic([(1, 3)].map(Position::from));
        let log = [other, crash];
        let stories = [story_of("duplicate effect", p, vec![], vec![(2, 12)])];
        let traces = HashMap::from([(p, 30_000)]);
        let spans = BTreeMap::new();
        let ev = Evidence {
            traces: &traces,
            run_started_ms: 0,
            log: &log,
            spans: &spans,
            stories: &stories,
            deliveries: &deliveries,
        };
        attribute(&mut anomalies, &ev);
        let f = &anomalies[0].followed[0];
        assert_eq!(f.faults.len(), 1, "{f:?}");
        assert_eq!(f.cause().map(|c| c.component.as_str()), Some("notifier-1"));
        assert_eq!(
            f.faults[0].matched.as_deref(),
            Some("it crashed holding message 2:12 uncommitted (received at 1.000 s, delivered again at 1.400 s)")
        );
        // Never delivered again: the crash is no cause by data.
        let mut none = one("duplicate effect", p);
        attribute(&mut none, &Evidence { deliveries: &deliveries[..2], ..ev });
        assert!(none[0].followed[0].faults.iter().all(|f| f.by != By::Data), "{:?}", none[0].followed);
    }

    #[test]
    fn a_kill_reaches_the_batch_its_process_last_received() {
        let p = Uuid::from_u128(3);
        let mut anomalies = one("missing effect", p);
        let delivery =
            |component: &str, at_ms, spans| DeliveryRecord { component: component.into(), at_ms, messages: 5, spans };
        let deliveries = [
            delivery("notifier-1", 1_000, vec![(0, 10, 14).into()]),
            delivery("notifier-2", 1_100, vec![(1, 0, 4).into()]),
            delivery("notifier-1", 1_200, vec![(0, 15, 19).into()]),
            delivery("notifier-1", 1_900, vec![(0, 20, 24).into()]),
        ];
        let log = [fault("process.kill", "notifier-1", 1_500), fault("process.kill", "notifier-2", 1_400)];
        let stories = [story_of("missing effect", p, vec![], vec![(0, 17)])];
        let traces = HashMap::from([(p, 30_000)]);
        let spans = BTreeMap::new();
        let ev = Evidence {
            traces: &traces,
            run_started_ms: 0,
            log: &log,
            spans: &spans,
            stories: &stories,
            deliveries: &deliveries,
        };
        attribute(&mut anomalies, &ev);
        let f = &anomalies[0].followed[0];
        assert_eq!(f.faults.len(), 1, "the other kill is neither in the batch nor near in time: {f:?}");
        assert_eq!(f.cause().map(|c| c.component.as_str()), Some("notifier-1"));
        assert_eq!(
            f.faults[0].matched.as_deref(),
            Some("the batch it last received before it (5 messages, at 1.200 s) held message 0:17")
        );
    }

    /// A kill after a database commit reaches what its process fetched
    /// past the group's position: delivered again, so it explains a
    /// duplicate and never a loss. An offset commit's reach is the other
    /// way round, read by `can_cause`.
    #[test]
    fn a_kill_after_a_commit_explains_a_duplicate_by_data_never_a_loss() {
        let mut kill = fault("db.kill_after_commit", "consumer-1", 4_000);
        kill.reach = Reach { seqs: vec![], spans: vec![(2, 10, 14).into()] };
        assert_eq!(
            reached(&kill, &[(1, 12), (2, 12)].map(Position::from), "duplicate effect").as_deref(),
            Some(
                "its process had fetched partition 2, offsets 10..=14, past the group's committed position: \
                 message 2:12 was delivered again"
            )
        );
        assert_eq!(
            reached(&kill, &[(2, 9), (2, 15)].map(Position::from), "duplicate effect"),
            None,
            "outside its span"
        );
        assert_eq!(
            reached(&kill, &[(2, 12)].map(Position::from), "missing effect"),
            None,
            "delivered again, so not lost by it"
        );
        let mut commit = fault("kafka.kill_after_offset_commit", "consumer-1", 4_000);
        commit.reach = kill.reach.clone();
        assert!(reached(&commit, &[(2, 12)].map(Position::from), "missing effect").is_some());
    }

    /// A message is fetched ahead: a kill before its first processing
    /// reaches it too. The duplicate names the last kill that reached it,
    /// and keeps every other kind of suspect.
    #[test]
    fn of_the_kills_that_reached_a_duplicate_the_latest_is_kept() {
        let suspect =
            |point: &str, at_ms| Suspect::of(&fault(point, "consumer-1", at_ms), 10_000, By::Data, Some("m".into()));
        let mut s = vec![
            suspect("db.kill_after_commit", 2_000),
            suspect("relay.after_produce", 1_000),
            suspect("db.kill_after_commit", 6_000),
            suspect("db.kill_after_commit", 4_000),
        ];
        latest_redelivery(&mut s);
        let kept: Vec<(&str, u64)> = s.iter().map(|s| (s.point.as_str(), s.at_ms)).collect();
        assert_eq!(kept, vec![("relay.after_produce", 1_000), ("db.kill_after_commit", 6_000)]);
    }
}
