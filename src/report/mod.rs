//! The run report: one serde struct written as `reports/<run-id>.json`, and
//! the tables people read, rendered from it for the terminal and for
//! `reports/<run-id>.md`. `chaos report <file>` renders a saved one again, so
//! showing never reaches back into a run.

pub mod assemble;
pub mod html;
pub mod junit;
pub mod progress;
pub mod schema;
pub mod shown;
pub mod summary;
mod windows;

use crate::error::{Error, Result};
use crate::faults::{FaultRecord, FaultSummary};
use crate::verifier::{Anomaly, Counts, Invariant, Verdict};
use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bumped whenever a field changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 1;

/// One run's report: what `chaos run` writes as `reports/<run-id>.json`
/// and prints with `--json`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Report {
    pub schema_version: u32,
    pub run_id: String,
    pub scenario: ScenarioInfo,
    pub seed: u64,
    /// The command that replays this run's fault decisions.
    pub replay: String,
    pub infra: InfraInfo,
    pub counts: Counts,
    pub faults: Vec<FaultSummary>,
    /// The first faults that fired, in order (the counters in `faults` count all).
    pub fault_log: Vec<FaultRecord>,
    /// Every firing struck in the harness's process, by occurrence: the
    /// `--schedule` that replays them (`chaos sweep --shrink` starts here).
    #[serde(default)]
    pub fired: crate::faults::Schedule,
    pub invariants: Vec<Invariant>,
    /// "The chaos happened" checks; a failing one makes the run inconclusive.
    pub chaos_checks: Vec<Invariant>,
    pub anomalies: Vec<Anomaly>,
    pub components: ComponentFigures,
    pub timings: Timings,
    /// Outbox created → inbox processed, per event (projection handler).
    #[serde(default)]
    pub latency_ms: Option<Latency>,
    /// When each stage first and last did something, in ms from the start.
    #[serde(default)]
    pub stages: Stages,
    /// The shared counters over time, sampled about every [`SAMPLE_EVERY_MS`]
    /// and thinned to at most [`SERIES_MAX`] points: the HTML report's chart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<Sample>,
    /// How long a fault lasts once it fires, by fault point, where the
    /// scenario says (`[[nemesis.timeline]] for`, `[nemesis] pause_secs`):
    /// the HTML report draws those as bands and every other fault as a mark.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fault_spans_ms: BTreeMap<String, u64>,
    /// Each anomaly example's story (its payment's rows and messages), read
    /// at verification only when there are anomalies, so that a saved report
    /// can be drawn again from its JSON alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stories: Vec<crate::verifier::story::Story>,
    /// A declared system's figures (operations by outcome, events,
    /// messages); absent for the payments pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<crate::verifier::declared::Figures>,
    /// What the run drove and what came of it, in its kind of system's
    /// words: every report draws these, never asking which kind ran.
    #[serde(default)]
    pub shown: shown::Shown,
    pub verdict: Verdict,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ScenarioInfo {
    pub name: String,
    pub path: String,
    pub exactly_once_expected: bool,
    pub payments: u64,
    pub partitions: i32,
    pub relays: usize,
    pub notifiers: usize,
    pub inbox: String,
    /// The program under test run as the notifier, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifier_command: Option<String>,
    /// The program under test run as the relays, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_command: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct InfraInfo {
    pub database: String,
    /// host:port/database; never a password.
    pub database_endpoint: String,
    pub schema: String,
    pub broker: String,
    pub brokers: String,
    pub topic: String,
    pub group: String,
    /// The fault proxy in front of PostgreSQL, and whom it serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// How the verifier read the topic: `read_committed`, so a
    /// transactional relay's aborted records are not counted.
    #[serde(default)]
    pub read_isolation: String,
}

/// What the components say about themselves: the run's counters at its
/// end.
pub use crate::context::Counts as ComponentFigures;

pub use crate::verifier::latency::{Latency, LatencyBucket};

/// The run's counters at one moment, in ms since the run started (the
/// fault log's clock).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct Sample {
    pub at_ms: u64,
    /// Payments written; for a declared system, the operations its service
    /// acknowledged.
    pub written: u64,
    /// Messages published, as the relays count them. For relays that count
    /// nothing for the harness (a declared system's, a program under test)
    /// the messages on the topic, read from its high watermarks: absent
    /// where the broker did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<u64>,
    /// Events processed, as the notifiers count them. For consumers that
    /// count nothing for the harness, the offsets their group committed,
    /// summed over the partitions: absent where the broker did not answer,
    /// and in every sample of a run whose group committed none (its
    /// consumers keep their positions elsewhere, and nothing the harness
    /// reads says what they applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<u64>,
}

/// How often the run samples its counters for [`Report::series`].
pub const SAMPLE_EVERY_MS: u64 = 250;
/// At most this many samples are kept: a long run keeps every other one
/// and samples half as often, so the JSON stays small.
pub const SERIES_MAX: usize = 2_000;

/// Where [`Report::save`] wrote the report.
#[derive(Debug, Clone)]
pub struct Saved {
    pub json: PathBuf,
    pub md: PathBuf,
    pub html: PathBuf,
}

/// First and last activity of each stage, in ms since the run started.
/// A stage never seen to act has neither: absent, not 0. Where the series
/// reads a stage's figure from the broker (a declared system's published
/// and applied), its marks are the samples that saw the figure grow: late
/// by up to one sampling interval.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Stages {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_write_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_write_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_publish_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_publish_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_apply_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_apply_ms: Option<u64>,
}

impl Stages {
    /// Milliseconds from `first` to `last`; 0 when either was never seen.
    pub fn between(first: Option<u64>, last: Option<u64>) -> u64 {
        match (first, last) {
            (Some(f), Some(l)) => l.saturating_sub(f),
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Timings {
    pub setup_ms: u64,
    pub workload_ms: u64,
    /// From the end of the workload to an empty outbox and zero group lag.
    pub drain_ms: u64,
    /// A declared system's settle after the drain: until its pending work
    /// is gone and its effects stay unchanged. Absent for the payments
    /// pipeline, which has no settle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_ms: Option<u64>,
    pub verify_ms: u64,
    pub total_ms: u64,
}

impl Report {
    /// Writes `<dir>/<run-id>.json`, `.md` and `.html`; returns the paths.
    pub fn save(&self, dir: &Path) -> Result<Saved> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Write { path: dir.into(), cause: e.to_string() })?;
        let json = dir.join(format!("{}.json", self.run_id));
        let md = dir.join(format!("{}.md", self.run_id));
        let html = dir.join(format!("{}.html", self.run_id));
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Internal(e.to_string()))?;
        std::fs::write(&json, text + "\n").map_err(|e| Error::Write { path: json.clone(), cause: e.to_string() })?;
        std::fs::write(&md, render(self, Style::Markdown))
            .map_err(|e| Error::Write { path: md.clone(), cause: e.to_string() })?;
        crate::report::html::write(self, &html)?;
        Ok(Saved { json, md, html })
    }

    pub fn load(path: &Path) -> Result<Self> {
        let err = |cause: String| Error::ReportRead { path: path.into(), cause };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
        match value.get("schema_version").and_then(|v| v.as_u64()) {
            Some(v) if v == SCHEMA_VERSION as u64 => {}
            Some(v) => return Err(err(format!("schema_version {v}; this chaos reads version {SCHEMA_VERSION}"))),
            None => return Err(err("no schema_version; is this a chaos report?".into())),
        }
        serde_json::from_value(value).map_err(|e| err(format!("not a chaos report: {e}")))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Terminal,
    Markdown,
}

fn table(style: Style, header: &[&str]) -> Table {
    let mut t = Table::new();
    match style {
        Style::Terminal => {
            // A terminal's tables wrap their cells to its width (`COLUMNS`);
            // Markdown rows stay whole, for the renderer to lay out.
            t.load_preset(presets::UTF8_FULL_CONDENSED);
            t.set_content_arrangement(ContentArrangement::Dynamic);
            t.set_width(summary::width() as u16);
        }
        Style::Markdown => {
            t.load_preset(presets::ASCII_MARKDOWN);
            t.set_content_arrangement(ContentArrangement::Disabled);
        }
    };
    t.set_header(header.iter().map(Cell::new));
    t
}

pub(crate) fn mark(ok: bool) -> &'static str {
    if ok {
        "✔"
    } else {
        "✘"
    }
}

/// An invariant's mark in this report: none when the run was not judged
/// (incomplete or interrupted), whose figures are partial, so that a run
/// stopped early never shows a check as held or broken.
pub(crate) fn judged_mark(r: &Report, ok: bool) -> &'static str {
    match r.verdict {
        Verdict::Incomplete | Verdict::Interrupted => "–",
        _ => mark(ok),
    }
}

/// The whole report as text: header, verification, faults, invariants,
/// anomalies, verdict.
pub fn render(r: &Report, style: Style) -> String {
    render_parts(r, style, true)
}

/// The report without its three header lines, for a live run that printed
/// them when it started.
pub fn render_body(r: &Report) -> String {
    render_parts(r, Style::Terminal, false)
}

fn render_parts(r: &Report, style: Style, header: bool) -> String {
    let mut out = String::new();
    if header {
        render_header(r, style, &mut out);
    }
    render_verification(r, style, &mut out);
    render_faults(r, style, &mut out);
    render_findings(r, style, &mut out);
    render_footer(r, &mut out);
    out
}

/// A section title in the report's style.
fn heading(style: Style, s: &str) -> String {
    match style {
        Style::Markdown => format!("\n## {s}\n\n"),
        Style::Terminal => format!("\n{s}\n"),
    }
}

/// The run's id, scenario and infrastructure.
fn render_header(r: &Report, style: Style, out: &mut String) {
    let md = style == Style::Markdown;
    if md {
        out.push_str(&format!("# chaos run {}\n\n", r.run_id));
    } else {
        out.push_str(&format!("chaos run {}\n", r.run_id));
    }
    out.push_str(&format!(
        "scenario {} ({}) · seed {} · {} {} · {} relays · {} notifiers · {} partitions · {}\n",
        r.scenario.name,
        r.scenario.path,
        r.seed,
        r.scenario.payments,
        r.shown.driven,
        r.scenario.relays,
        r.scenario.notifiers,
        r.scenario.partitions,
        {
            let mut parts = vec![match &r.scenario.notifier_command {
                Some(c) => format!("notifier: the program under test `{c}`"),
                None => format!("inbox {}", r.scenario.inbox),
            }];
            if let Some(c) = &r.scenario.relay_command {
                parts.push(format!("relay: the program under test `{c}`"));
            }
            parts.join(" · ")
        }
    ));
    out.push_str(&format!(
        "infra: {} {} schema {} · {} {} topic {} (read {})\n",
        r.infra.database,
        r.infra.database_endpoint,
        r.infra.schema,
        r.infra.broker,
        r.infra.brokers,
        r.infra.topic,
        r.infra.read_isolation
    ));
}

/// The counts read from the ground truth.
fn render_verification(r: &Report, style: Style, out: &mut String) {
    out.push_str(&heading(style, &r.shown.verification_title));
    let mut t = table(style, &["measure", "value"]);
    for (k, v) in &r.shown.verification {
        t.add_row(vec![Cell::new(k), Cell::new(v)]);
    }
    out.push_str(&format!("{t}\n"));
}

/// The fault rows a report shows: every point, or for a system struck
/// only from outside, the points it sets or that fired.
pub(crate) fn shown_faults(r: &Report) -> impl Iterator<Item = &FaultSummary> {
    r.faults.iter().filter(|f| r.shown.every_fault_point || f.probability > 0.0 || f.fired > 0)
}

/// The items a report keeps of `all`, joined by "; ", and how many it left
/// out: "a; b; c … and 1 more". A list never looks whole when it is not.
fn listed(kept: &[String], all: u64) -> String {
    let text = kept.join("; ");
    match all.saturating_sub(kept.len() as u64) {
        0 => text,
        more => format!("{text} … and {more} more"),
    }
}

/// The timings in one line: "setup 258 ms · workload 3055 ms · …", the
/// settle among them when the run had one.
pub(crate) fn timings_line(tm: &Timings) -> String {
    let settle = tm.settle_ms.map(|ms| format!(" · settle {ms} ms")).unwrap_or_default();
    format!(
        "setup {} ms · workload {} ms · drain {} ms{settle} · verify {} ms · total {} ms",
        tm.setup_ms, tm.workload_ms, tm.drain_ms, tm.verify_ms, tm.total_ms
    )
}

/// The verification table's rows, for the text and the HTML reports.
pub(crate) fn verification_rows(c: &Counts) -> Vec<(&'static str, String)> {
    let mut rows = vec![
        ("payments committed (the workload's own record)", c.payments_committed.to_string()),
        ("payments captured (rows)", format!("{} of {}", c.payments_captured, c.payments)),
        ("outbox events", format!("{} ({} unpublished)", c.outbox_events, c.unpublished)),
        ("messages on the topic", format!("{} ({} duplicates)", c.topic_messages, c.topic_duplicates)),
        (
            "events processed once",
            format!(
                "{} (inbox rows: {})",
                c.inbox_rows_by_handler.get("projection").copied().unwrap_or(0),
                c.inbox_rows
            ),
        ),
        ("receipts sent", format!("{} for {} payments", c.receipts, c.payments_captured)),
        (
            "payments by receipts",
            format!(
                "{} with one, {} with none, {} with more",
                c.payments_with_one_receipt, c.payments_without_receipt, c.payments_with_many_receipts
            ),
        ),
        ("projection shows captured", c.projection_captured.to_string()),
        ("authorized after captured", format!("{} payments", c.reordered_payments)),
        (
            "dead letters",
            format!(
                "{} ({} malformed events, {} matched by id)",
                c.dead_letters, c.poison_events, c.dead_letters_matched
            ),
        ),
        ("loyalty points", format!("{} (expected {})", c.loyalty_points, c.loyalty_points_expected)),
        ("loyalty credits", c.loyalty_credits.to_string()),
    ];
    // Only a run whose emails were checked has the line: others read as before.
    if let Some(line) = emails_line(c) {
        rows.insert(rows.iter().position(|(k, _)| *k == "payments by receipts").map_or(rows.len(), |i| i + 1), line);
    }
    rows
}

/// "1000 for 1000 payments (37 repeats absorbed by the provider)", with the
/// refused requests when there were some; `None` when no emails were checked.
fn emails_line(c: &Counts) -> Option<(&'static str, String)> {
    let sent = c.emails_sent?;
    let absorbed = c.emails_absorbed.unwrap_or(0);
    let mut v = format!("{sent} for {} payments ({absorbed} repeats absorbed by the provider", c.payments_captured);
    match c.emails_refused.unwrap_or(0) {
        0 => v.push(')'),
        n => v.push_str(&format!(", {n} requests refused)")),
    }
    Some(("emails sent", v))
}

/// Every fault point: reached, fired, confirmed; then what the components say.
fn render_faults(r: &Report, style: Style, out: &mut String) {
    let h = |s: &str| heading(style, s);
    out.push_str(&h("Faults"));
    let mut t = table(style, &["fault point", "probability", "per", "reached", "fired", "confirmed"]);
    for f in shown_faults(r) {
        t.add_row(vec![
            Cell::new(&f.point),
            Cell::new(f.rates()).set_alignment(CellAlignment::Right),
            Cell::new(&f.unit),
            Cell::new(f.occurrences).set_alignment(CellAlignment::Right),
            Cell::new(f.fired).set_alignment(CellAlignment::Right),
            Cell::new(f.confirmed).set_alignment(CellAlignment::Right),
        ]);
    }
    out.push_str(&format!("{t}\n"));
    // A firing with no effect of its own, because another fault ended its
    // process first: which, and why (the confirmed column leaves them out).
    for f in r.faults.iter().filter(|f| f.preempted > 0) {
        out.push_str(&format!(
            "pre-empted: {} {} of {} firing(s), their process ended by another fault first: {}\n",
            f.point,
            f.preempted,
            f.fired,
            listed(&f.preempted_why, f.preempted)
        ));
    }
    // Aimed kills read per second: the seconds drawn, the arms, and how
    // many of them met a window (an arm still waiting at the end is none).
    for f in r.faults.iter() {
        if let Some((seconds, arms)) = f.armed {
            let roles: String = f.per_role.iter().map(|(role, rate)| format!(", {role} {rate}")).collect();
            out.push_str(&format!(
                "armed: {} at {}{roles} per second: {arms} arm(s) in {seconds} process-second(s), {} struck at a window\n",
                f.point, f.probability, f.fired
            ));
        }
    }
    let k = &r.components;
    if r.shown.components_counted {
        out.push_str(&format!(
        "components: {} relay batches, {}, {} duplicates absorbed by the inbox, {} stale events ignored by the projection, {} relay errors, {} notifier errors; purged {} outbox and {} inbox rows\n",
        k.relay_batches, crashes(r), k.duplicates_absorbed, k.stale_ignored, k.relay_errors, k.notifier_errors, k.purged_outbox_rows, k.purged_inbox_rows
    ));
    }
    if k.processes_started > 0 {
        out.push_str(&format!(
            "processes: {} started, {} killed ({} with database sessions open, {} of them seen gone from pg_stat_activity), {} paused\n",
            k.processes_started, k.processes_killed, k.sessions_at_kill, k.sessions_gone_after_kill, k.processes_paused
        ));
    }
    if k.group_waits > 0 {
        out.push_str(&format!(
            "waited: {} consumer process-second(s) not struck while their group rebalanced\n",
            k.group_waits
        ));
    }
    if k.waited_for_ports_ms > 0 {
        out.push_str(&format!(
            "waited {:.1} s for the fault proxy's Kafka ports, which another run held\n",
            k.waited_for_ports_ms as f64 / 1000.0
        ));
    }
    if k.commits_written + k.commits_empty > 0 {
        out.push_str(&format!(
            "commits through the fault proxy: {} that changed rows, {} empty or read-only (no aimed kill strikes those)\n",
            k.commits_written, k.commits_empty
        ));
    }
    if let Some(line) = power(k) {
        out.push_str(&format!(
            "{line}
"
        ));
    }
    if let Some(lines) = windows::lines(r) {
        out.push_str(&lines);
    }
}

/// Where the random kills and pauses landed, when PostgreSQL could show
/// it: "power: 9 of 23 random kills landed with a transaction open, 4
/// before any database session; 1 of 3 pauses with a transaction open".
/// Aimed kills (the fault proxy's) land in their window by construction.
pub fn power(k: &ComponentFigures) -> Option<String> {
    let mut parts = Vec::new();
    if k.random_kills_measured > 0 {
        parts.push(format!(
            "{} of {} random kills landed with a transaction open, {} before any database session",
            k.random_kills_in_transaction, k.random_kills_measured, k.random_kills_without_session
        ));
    }
    if k.pauses_measured > 0 {
        parts.push(format!("{} of {} pauses with a transaction open", k.pauses_in_transaction, k.pauses_measured));
    }
    (!parts.is_empty()).then(|| format!("power: {}", parts.join("; ")))
}

/// The components' crashes: a program under test does not crash at our
/// fault points, the nemesis kills it, so its kills are what count.
fn crashes(r: &Report) -> String {
    let k = &r.components;
    let under_test = r.scenario.notifier_command.is_some() || r.scenario.relay_command.is_some();
    match (under_test, r.scenario.notifier_command.is_some()) {
        (false, _) => format!("{} relay crashes, {} notifier crashes", k.relay_crashes, k.notifier_crashes),
        (true, true) => format!(
            "{} relay crashes, the program(s) under test killed {} times and paused {} times",
            k.relay_crashes, k.processes_killed, k.processes_paused
        ),
        (true, false) => format!(
            "the program(s) under test killed {} times and paused {} times, {} notifier crashes",
            k.processes_killed, k.processes_paused, k.notifier_crashes
        ),
    }
}

/// The invariants and chaos checks, then the anomalies with their examples.
fn render_findings(r: &Report, style: Style, out: &mut String) {
    let h = |s: &str| heading(style, s);
    let md = style == Style::Markdown;
    out.push_str(&h("Invariants"));
    let mut t = table(style, &["", "invariant", "expected", "actual"]);
    for i in r.invariants.iter().chain(r.chaos_checks.iter()) {
        t.add_row(vec![
            Cell::new(judged_mark(r, i.ok)),
            Cell::new(&i.name),
            Cell::new(&i.expected),
            Cell::new(&i.actual),
        ]);
    }
    out.push_str(&format!("{t}\n"));
    if matches!(r.verdict, Verdict::Incomplete | Verdict::Interrupted) && !r.invariants.is_empty() {
        out.push_str("not judged: the run did not complete, so these figures are partial and no check is marked\n");
    }

    if !r.anomalies.is_empty() {
        out.push_str(&h("Anomalies"));
        let examples = format!("examples (up to {})", crate::verifier::reconcile::EXAMPLES);
        let mut t = table(style, &["anomaly", "count", &examples]);
        for a in &r.anomalies {
            let sep = if md { "<br>" } else { "\n" };
            t.add_row(vec![Cell::new(&a.name), Cell::new(a.count), Cell::new(a.examples.join(sep))]);
        }
        out.push_str(&format!("{t}\n"));
        render_followed(r, style, out);
    }
}

/// Each dated example and its cause ([`crate::verifier::attribution`]):
/// the fault whose logged reach held its data, or else the faults that
/// fired around its last trace, marked "by time": suspects, not proof.
fn render_followed(r: &Report, style: Style, out: &mut String) {
    let dated: Vec<_> = r.anomalies.iter().flat_map(|a| a.followed.iter().map(move |f| (a, f))).collect();
    if dated.is_empty() {
        return;
    }
    let md = style == Style::Markdown;
    out.push_str(&heading(style, CAUSES));
    let last = "last trace (s into the run)";
    let mut t = table(style, &["anomaly", "payment or event", last, &cause_column()]);
    for (a, f) in dated {
        let sep = if md { "<br>" } else { "\n" };
        let suspects = f.suspects(sep);
        t.add_row(vec![
            Cell::new(&a.name),
            Cell::new(&f.subject),
            Cell::new(format!("{:.3}", f.trace_ms as f64 / 1000.0)),
            Cell::new(suspects),
        ]);
    }
    out.push_str(&format!("{t}\n"));
}

/// The heading of the anomalies' causes, in every report.
pub const CAUSES: &str = "What caused each example";

/// Its column of causes.
pub fn cause_column() -> String {
    use crate::verifier::attribution::{AFTER_MS, WINDOW_MS};
    format!(
        "cause (matched by data), or faults from {} s before to {} s after (by time)",
        WINDOW_MS / 1000,
        AFTER_MS / 1000
    )
}

/// Timings, latency, the replay command and the verdict.
fn render_footer(r: &Report, out: &mut String) {
    let tm = &r.timings;
    out.push_str(&format!("\ntimings: {}\n", timings_line(tm)));
    if let Some(l) = &r.latency_ms {
        out.push_str(&format!(
            "latency outbox → inbox over {} events: p50 {:.0} ms · p95 {:.0} ms · p99 {:.0} ms · max {:.0} ms\n",
            l.events, l.p50, l.p95, l.p99, l.max
        ));
    }
    out.push_str(&format!("replay: {}\n", r.replay));
    out.push_str(&format!("\nverdict: {} — {}\n", r.verdict.as_str().to_uppercase(), r.reason));
}

/// `chaos report <folder>`: the runs whose reports the folder holds, oldest
/// first (run ids sort by time), with their verdicts. A file that is not a
/// run's report (a bench's, a sweep's summary, a JUnit file) is left out; one that cannot be
/// read is listed as such, never skipped in silence.
pub fn list(dir: &Path) -> Result<String> {
    let read = std::fs::read_dir(dir).map_err(|e| Error::ReportRead { path: dir.into(), cause: e.to_string() })?;
    let mut files: Vec<std::path::PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| !p.to_string_lossy().ends_with(".bench.json"))
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("sweep-")))
        .collect();
    // Oldest first: by the time in the run id a report is named by, else
    // (a report renamed or kept as a sample) by when it was written.
    let when = |p: &std::path::PathBuf| {
        let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        crate::domain::names::run_id_time(&stem).unwrap_or_else(|| {
            p.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs())
        })
    };
    files.sort_by_cached_key(|p| (when(p), p.clone()));
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["run", "scenario", "seed", "verdict", "why"]);
    let (mut runs, mut bad) = (0, 0);
    for f in &files {
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        match Report::load(f) {
            Ok(r) => {
                runs += 1;
                t.add_row(vec![
                    Cell::new(&r.run_id),
                    Cell::new(&r.scenario.name),
                    Cell::new(r.seed),
                    Cell::new(r.verdict.as_str()),
                    Cell::new(short_reason(&r.reason)),
                ])
            }
            Err(e) => {
                bad += 1;
                t.add_row(vec![Cell::new(name), Cell::new("—"), Cell::new("—"), Cell::new("unreadable"), Cell::new(e)])
            }
        };
    }
    Ok(format!("{t}\n{runs} run(s), oldest first, {bad} unreadable, in {}\n", dir.display()))
}

/// A reason cut to one table line.
fn short_reason(reason: &str) -> String {
    let mut s: String = reason.chars().take(100).collect();
    if reason.chars().count() > 100 {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample report, in the payments pipeline's words.
    fn sample() -> Report {
        let mut r: Report =
            serde_json::from_str(include_str!("../../reports/sample-payments-postgres-kafka.json")).unwrap();
        r.shown = shown::Shown::payments(&r);
        r
    }

    #[test]
    fn a_run_that_was_not_judged_marks_no_invariant() {
        let mut r = sample();
        assert!(!r.invariants.is_empty());
        let section = |text: &str| text[text.find("Invariants").unwrap()..].to_string();
        assert!(section(&render(&r, Style::Terminal)).contains('✔'), "a judged run marks its checks");
        r.verdict = Verdict::Incomplete;
        let partial = section(&render(&r, Style::Terminal));
        let rows = &partial[..partial.find("not judged").expect("says it was not judged")];
        assert!(!rows.contains('✔') && !rows.contains('✘'), "{rows}");
    }

    /// The report keeps the first five reasons of pre-empted firings: a
    /// sixth is counted, not silently dropped.
    #[test]
    fn a_list_that_leaves_items_out_says_how_many() {
        let mut r = sample();
        let line = |r: &Report| {
            let text = render(r, Style::Markdown);
            text.lines().find(|l| l.starts_with("pre-empted: ")).expect(&text).to_string()
        };
        let f = &mut r.faults[0];
        (f.fired, f.preempted) = (9, 6);
        f.preempted_why = (1..=5).map(|i| format!("notifier-1 at {i} ms: killed first")).collect();
        assert!(line(&r).ends_with("notifier-1 at 5 ms: killed first … and 1 more"), "{}", line(&r));
        r.faults[0].preempted = 5;
        assert!(line(&r).ends_with("at 5 ms: killed first"), "all five shown: {}", line(&r));
    }

    /// A declared run's settle is in its timings and its verification
    /// table: how long, and how much pending work it waited for.
    #[test]
    fn a_settle_is_shown_with_the_work_it_waited_for() {
        let mut r = sample();
        assert!(!render(&r, Style::Markdown).contains("settle"), "the payments pipeline has no settle");
        r.timings.settle_ms = Some(17_140);
        let figures = crate::verifier::declared::Figures { pending_at_settle: Some(42), ..Default::default() };
        r.shown = shown::Shown::declared(&r, &figures);
        let text = render(&r, Style::Markdown);
        assert!(text.contains(" · settle 17140 ms · "), "{text}");
        let row = text.lines().find(|l| l.starts_with("| settled ")).expect(&text);
        assert!(row.contains("| 17.1 s after the drain, for 42 rows of system.pending "), "{row}");
    }

    #[test]
    fn the_emails_line_shows_only_when_emails_were_checked() {
        let mut r = sample();
        // The sample sent its receipts as emails: without them, it is a
        // run whose scenario sends none.
        (r.counts.emails_sent, r.counts.emails_absorbed, r.counts.emails_refused) = (None, None, None);
        r.shown = shown::Shown::payments(&r);
        assert!(!render(&r, Style::Terminal).contains("emails sent"), "a run without emails reads as before");
        r.counts.payments_captured = 1000;
        (r.counts.emails_sent, r.counts.emails_absorbed, r.counts.emails_refused) = (Some(1000), Some(37), Some(0));
        r.shown = shown::Shown::payments(&r);
        // Markdown keeps a cell on one line; the terminal wraps it to its width.
        let text = render(&r, Style::Markdown);
        assert!(text.contains("1000 for 1000 payments (37 repeats absorbed by the provider)"), "{text}");
        assert!(render(&r, Style::Terminal).contains("repeats absorbed"));
        r.counts.emails_refused = Some(2);
        r.shown = shown::Shown::payments(&r);
        let text = render(&r, Style::Markdown);
        assert!(text.contains("(37 repeats absorbed by the provider, 2 requests refused)"), "{text}");
    }

    #[test]
    fn a_program_under_test_is_counted_by_its_kills() {
        let mut r = sample();
        r.scenario.notifier_command = Some("python3 consumer.py".into());
        r.components.processes_killed = 23;
        r.components.notifier_crashes = 0;
        let text = render(&r, Style::Terminal);
        assert!(text.contains("the program(s) under test killed 23 times"), "{text}");
        assert!(!text.contains("0 notifier crashes"), "{text}");
    }
}
