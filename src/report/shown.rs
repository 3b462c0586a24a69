//! What a run drove and what came of it, in the words of its kind of
//! system. The kind chooses its words once, when the report is built
//! (`harness/run/system.rs`); every report (the tables, the summary, the
//! HTML page, its charts) draws them alike and never asks which kind ran,
//! so a new kind of system adds its words, not a branch in each report.

use super::Report;
use crate::verifier::declared::Figures;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind of system's words for the report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Shown {
    /// What the run drove, as the header says it: "payments",
    /// "operations of a declared system".
    pub driven: String,
    /// The verification table's title, and its rows (measure, value).
    pub verification_title: String,
    pub verification: Vec<(String, String)>,
    /// The summary's lines of what the operations came to, and the topic.
    pub effects: Vec<(String, String)>,
    /// The HTML page's tiles of the same.
    pub tiles: Vec<Tile>,
    /// Whether the harness's own components ran and counted (relay
    /// batches, crashes, duplicates the inbox absorbed): a declared
    /// system's programs count nothing for the harness.
    pub components_counted: bool,
    /// The harness's own component instances, one lane each on the page.
    pub instances: Vec<String>,
    /// Whether the faults table lists every fault point; a system struck
    /// only from outside lists the points it sets or that fired.
    pub every_fault_point: bool,
    /// Whether `db.hold_commit` can hold a writer's COMMIT (a declared
    /// service's, through the fault proxy), so that a held commit can be
    /// overtaken by later ones.
    pub writers_held: bool,
    /// The events chart's three lines: written, published, applied.
    pub series: [String; 3],
    /// Where the chart's figures come from, in the page's words.
    pub sampled_from: String,
}

/// A tile of the HTML page's summary.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Tile {
    pub id: String,
    pub label: String,
    pub value: String,
    pub detail: String,
    /// Its CSS class: "bad", "ok" or none.
    pub class: String,
}

fn tile(id: &str, label: &str, value: impl ToString, detail: String, class: &str) -> Tile {
    Tile { id: id.into(), label: label.into(), value: value.to_string(), detail, class: class.into() }
}

fn rows(rows: Vec<(&str, String)>) -> Vec<(String, String)> {
    rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

impl Shown {
    /// The payments pipeline's words: its counts, its components, and a
    /// program under test in a role where it runs one.
    pub fn payments(r: &Report) -> Self {
        let c = &r.counts;
        let s = &r.scenario;
        let mut effects = format!(
            "{} payments → {} receipts ({} missing, {} doubled)",
            c.payments_captured, c.receipts, c.payments_without_receipt, c.payments_with_many_receipts
        );
        if let Some(sent) = c.emails_sent {
            effects.push_str(&format!(" · {sent} emails"));
        }
        let bad = |b: bool| if b { "bad" } else { "ok" };
        let mut instances: Vec<String> = Vec::new();
        if s.relay_command.is_none() {
            instances.extend((1..=s.relays).map(|i| format!("relay-{i}")));
        }
        if s.notifier_command.is_none() {
            instances.extend((1..=s.notifiers).map(|i| format!("notifier-{i}")));
        }
        let (relay, notifier) = (s.relay_command.is_some(), s.notifier_command.is_some());
        Self {
            driven: "payments".into(),
            verification_title: "Verification (from the database and the full topic)".into(),
            verification: rows(super::verification_rows(c)),
            effects: vec![
                ("effects".into(), effects),
                (
                    "topic".into(),
                    format!(
                        "{} messages for {} events ({} duplicates)",
                        c.topic_messages, c.outbox_events, c.topic_duplicates
                    ),
                ),
            ],
            tiles: vec![
                tile(
                    "driven",
                    "payments",
                    c.payments,
                    format!("{} captured · {} committed", c.payments_captured, c.payments_committed),
                    "",
                ),
                tile(
                    "effects",
                    "receipts",
                    c.receipts,
                    format!(
                        "{} payments with several · {} with none",
                        c.payments_with_many_receipts, c.payments_without_receipt
                    ),
                    bad(c.payments_with_many_receipts + c.payments_without_receipt > 0),
                ),
                tile(
                    "messages",
                    "messages",
                    c.topic_messages,
                    format!(
                        "{} duplicates · {} absorbed by the inbox",
                        c.topic_duplicates, r.components.duplicates_absorbed
                    ),
                    "",
                ),
            ],
            components_counted: true,
            instances,
            every_fault_point: true,
            writers_held: false,
            series: [
                "payments written".into(),
                if relay { "messages on the topic" } else { "messages published" }.into(),
                if notifier { "offsets committed" } else { "events processed" }.into(),
            ],
            sampled_from: if relay || notifier {
                "from the shared counters and, for the program under test, from the broker (the messages on the \
                 topic, the offsets its consumer group committed)"
            } else {
                "from the shared counters"
            }
            .into(),
        }
    }

    /// A declared system's words: its operations, events and messages,
    /// read from its workload's answers and the broker, and its settle.
    pub fn declared(r: &Report, f: &Figures) -> Self {
        let settled = settled(r, f);
        let mut verification = rows(vec![
            (
                "operations asked for",
                format!(
                    "{} ({} acknowledged, {} refused, {} ambiguous)",
                    f.operations, f.acknowledged, f.refused, f.ambiguous
                ),
            ),
            ("outbox events written", f.outbox_events.to_string()),
            ("messages on the topic", format!("{} ({} duplicates)", f.messages, f.duplicate_messages)),
        ]);
        let mut effects = vec![
            (
                "effects".to_string(),
                format!(
                    "{} operations: {} acknowledged, {} refused, {} ambiguous → {} events",
                    f.operations, f.acknowledged, f.refused, f.ambiguous, f.outbox_events
                ),
            ),
            ("topic".to_string(), format!("{} messages ({} duplicates)", f.messages, f.duplicate_messages)),
        ];
        if let Some(s) = &settled {
            verification.push(("settled".into(), s.clone()));
            // The wait for a consumer's stored work, which a run's length
            // otherwise leaves unexplained.
            if f.pending_at_settle.is_some_and(|n| n > 0) {
                effects.push(("settled".into(), s.clone()));
            }
        }
        Self {
            driven: "operations of a declared system".into(),
            verification_title:
                "Verification (from the record of intent, the outbox log, the full topic and your queries)".into(),
            verification,
            effects,
            tiles: vec![
                tile(
                    "driven",
                    "operations",
                    f.operations,
                    format!("{} acknowledged · {} refused · {} ambiguous", f.acknowledged, f.refused, f.ambiguous),
                    "",
                ),
                tile("effects", "outbox events", f.outbox_events, String::new(), ""),
                tile("messages", "messages", f.messages, format!("{} duplicates", f.duplicate_messages), ""),
            ],
            components_counted: false,
            instances: Vec::new(),
            every_fault_point: false,
            writers_held: true,
            series: ["operations acknowledged".into(), "messages on the topic".into(), "offsets committed".into()],
            sampled_from: "from the workload's answers and from the broker: a declared system's programs count \
                           nothing for the harness, so the messages on its topic and the offsets its consumer group \
                           committed are read there, and a gap in a line is a sample the broker did not answer for"
                .into(),
        }
    }
}

/// A declared run's settle after the drain, in a few words: "17.1 s after
/// the drain, for 42 rows of system.pending"; None for a run that did not
/// settle (one cut short before it).
fn settled(r: &Report, f: &Figures) -> Option<String> {
    let secs = r.timings.settle_ms? as f64 / 1000.0;
    Some(match f.pending_at_settle {
        Some(n) => format!("{secs:.1} s after the drain, for {n} rows of system.pending"),
        None => format!("{secs:.1} s after the drain (no system.pending declared: until the effects were unchanged)"),
    })
}
