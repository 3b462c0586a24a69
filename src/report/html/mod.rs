//! The HTML report, `reports/<run-id>.html`: one self-contained page drawn
//! from the [`Report`] alone (so `chaos report <file.json> --html` draws a
//! saved run again). Nothing is loaded from the network: the styles are
//! inline and the charts are SVG drawn by plotters into the page.
//!
//! - The verdict, then the harm in the terminal summary's words, then
//!   tiles of the figures a reader looks for first.
//! - Events written, published and processed over time, each fault a mark
//!   at its time, or a band where the scenario says how long it lasts.
//! - The latency distribution (its buckets; the percentiles in older reports).
//! - The verification, fault and invariant tables of [`crate::report::render`].
//! - Each anomaly example's story on one line of time ([`crate::verifier::story`]).
//!
//! This file writes the page itself: its header, tiles, sections and
//! tables. The run's charts are drawn in `charts.rs`, on the one time axis
//! of `axis.rs`; the anomalies' stories in `stories.rs`.

mod axis;
mod charts;
mod stories;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::report::{self, Report};
use crate::verifier::Verdict;
use axis::{seconds, TimeAxis};
use std::fmt::Write as _;
use std::path::Path;

/// Writes the page for `r` at `path`.
pub fn write(r: &Report, path: &Path) -> Result<()> {
    std::fs::write(path, render(r)).map_err(|e| Error::Write { path: path.into(), cause: e.to_string() })
}

/// A page of `chaos`'s own: one style for a run's page and a sweep's, and
/// nothing loaded from elsewhere. `heading` and `body` are HTML.
pub fn page(title: &str, heading: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{heading}</h1>\n{body}</body></html>\n",
        esc(title)
    )
}

/// The whole page.
pub fn render(r: &Report) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let verdict = r.verdict.as_str();
    // One time axis for every chart that spans the run, so they line up.
    let axis = TimeAxis::of(r);
    harm(r, &mut out);
    let _ = writeln!(out, "<p class=\"why\">{}</p>", esc(&r.reason));
    tiles(r, &mut out);
    header(r, &mut out);
    section(&mut out, "throughput", "Events over time", |out| {
        let note = match r.fault_log.len() as u64 {
            n if n < fired(r) => {
                format!(" The fault log keeps the first {n} of {} firings; only those are drawn.", fired(r))
            }
            _ => String::new(),
        };
        let _ = write!(
            out,
            "<p>Sampled every {} ms {}. Each fault is a vertical mark at its time, \
             or a band where the scenario gives its length, with its point's code above the chart.{note}</p>",
            report::SAMPLE_EVERY_MS,
            charts::sampled_from(r)
        );
        out.push_str(&charts::events_chart(r, &axis));
        charts::events_legend(r, out);
        charts::code_legend(r, out);
    });
    let lanes = charts::instances(r);
    if !lanes.is_empty() {
        section(&mut out, "instances", "Faults by component instance", |out| {
            out.push_str(
                "<p>One lane per instance the scenario starts and per component a fault fired in (its firings \
                 logged in brackets), on the time axis of the chart above: each firing a mark in its point's \
                 colour, with its code where there is room.</p>",
            );
            out.push_str(&charts::lanes_chart(r, &axis, &lanes));
        });
    }
    if !r.anomalies.is_empty() {
        anomalies(r, &mut out);
        section(&mut out, "stories", "The anomalies' examples, each on one line of time", |out| {
            out.push_str(
                "<p>Each example's payment as the database dates it (the payment, its outbox rows, inbox claims \
                 and effects), each delivery of its messages to a notifier, and the faults of the run in its \
                 window. Its messages on the topic are listed with <code>partition:offset</code> below the \
                 line (the verifier's read of the topic keeps no broker timestamps; a message is dated by its \
                 deliveries). The reference notifiers log each batch they receive; a program under test reports \
                 none, and there its inbox claims stand for its deliveries.</p>",
            );
            if r.stories.is_empty() {
                out.push_str("<p>No story was collected for these examples.</p>");
            }
            for (i, s) in r.stories.iter().enumerate() {
                stories::story(r, s, i, out);
            }
        });
    }
    section(&mut out, "latency", "Latency, outbox row created → event processed", |out| match &r.latency_ms {
        Some(l) => {
            let _ = write!(
                out,
                "<p>{} events: p50 {:.0} ms · p95 {:.0} ms · p99 {:.0} ms · max {:.0} ms</p>",
                l.events, l.p50, l.p95, l.p99, l.max
            );
            out.push_str(&charts::latency_chart(l));
            charts::latency_legend(l, out);
        }
        None => out.push_str(
            "<p>No latency was measured: it is read from the projection's inbox claims, and this run has none \
             (its inbox is off or bypassed), or it was not verified.</p>",
        ),
    });
    tables(r, &mut out);
    let _ = writeln!(out, "<p class=\"replay\">replay: <code>{}</code></p>", esc(&r.replay));
    let heading =
        format!("chaos run {} <span class=\"verdict {verdict}\">{}</span>", esc(&r.run_id), verdict.to_uppercase());
    page(&format!("chaos run {} · {verdict}", r.run_id), &heading, &out)
}

/// The harm first, in the lines the terminal's summary opens with (its
/// `harm`, the anomalies by name, one example and its cause), so a
/// failing page is read as the terminal is. Nothing when no harm was found.
fn harm(r: &Report, out: &mut String) {
    let mut lines: Vec<(String, String)> = Vec::new();
    // One line per label: the page wraps them, the terminal's width does not apply.
    report::summary::harm_lines(&mut lines, r, usize::MAX);
    if lines.is_empty() {
        return;
    }
    out.push_str("<section id=\"harm\" class=\"harm\"><dl>");
    for (i, (label, text)) in lines.iter().enumerate() {
        match (i, label.as_str()) {
            // A line without a label goes on with the one above it.
            (_, "") => _ = write!(out, "<dd>{}</dd>", esc(text)),
            (0, _) => _ = write!(out, "<dt>{}</dt><dd class=\"first\">{}</dd>", esc(label), esc(text)),
            _ => _ = write!(out, "<dt>{}</dt><dd>{}</dd>", esc(label), esc(text)),
        }
    }
    out.push_str("</dl></section>\n");
}

/// The run at a glance, one tile per figure a reader looks for first:
/// the verdict, what was driven, its effects, the messages, the faults
/// and the checks, and the slowest events.
fn tiles(r: &Report, out: &mut String) {
    let judged = !matches!(r.verdict, Verdict::Incomplete | Verdict::Interrupted);
    let checks: Vec<_> = r.invariants.iter().chain(r.chaos_checks.iter()).collect();
    let held = checks.iter().filter(|i| i.ok).count();
    let confirmed: u64 = r.faults.iter().map(|f| f.confirmed).sum();
    let bad = |b: bool| if b { "bad" } else { "ok" };
    let mut tiles: Vec<Tile> = vec![(
        "verdict",
        "verdict",
        r.verdict.as_str().to_uppercase(),
        if r.scenario.exactly_once_expected { "exactly once expected" } else { "exactly once not expected" }.into(),
        r.verdict.as_str(),
    )];
    tiles.extend(effect_tiles(r, judged));
    tiles.push(("faults", "faults fired", fired(r).to_string(), format!("{confirmed} confirmed"), ""));
    tiles.push((
        "invariants",
        "invariants held",
        if judged { format!("{held}/{}", checks.len()) } else { format!("–/{}", checks.len()) },
        if judged { format!("{} broken", checks.len() - held) } else { "not judged".into() },
        if judged { bad(held < checks.len()) } else { "" },
    ));
    tiles.push(match &r.latency_ms {
        Some(l) => (
            "latency",
            "p99 latency",
            format!("{:.0} ms", l.p99),
            format!("p50 {:.0} ms · max {:.0} ms", l.p50, l.max),
            "",
        ),
        None => ("latency", "p99 latency", "–".into(), "not measured".into(), ""),
    });
    out.push_str("<section id=\"summary\" class=\"tiles\">\n");
    for (id, label, value, detail, class) in tiles {
        let _ = writeln!(
            out,
            "<div class=\"tile{}\" id=\"tile-{id}\"><div class=\"label\">{}</div>\
             <div class=\"value\">{}</div><div class=\"detail\">{}</div></div>",
            if class.is_empty() { String::new() } else { format!(" {class}") },
            esc(label),
            esc(&value),
            esc(&detail)
        );
    }
    out.push_str("</section>\n");
}

/// A tile: its id, label, value, detail and CSS class.
type Tile<'a> = (&'a str, &'a str, String, String, &'a str);

/// The three tiles of what the run drove and what came of it, in its kind
/// of system's words; a run not judged marks none of them good or bad.
fn effect_tiles(r: &Report, judged: bool) -> Vec<Tile<'_>> {
    let shown = r.shown.tiles.iter();
    shown
        .map(|t| {
            let class = if judged || t.class != "bad" { t.class.as_str() } else { "" };
            (t.id.as_str(), t.label.as_str(), t.value.clone(), t.detail.clone(), class)
        })
        .collect()
}

/// Every firing the run counted, logged or not.
fn fired(r: &Report) -> u64 {
    r.faults.iter().map(|f| f.fired).sum()
}

fn section(out: &mut String, id: &str, title: &str, body: impl FnOnce(&mut String)) {
    let _ = writeln!(out, "<section id=\"{id}\"><h2>{}</h2>", esc(title));
    body(out);
    out.push_str("</section>\n");
}

/// The scenario and the infrastructure, as the text report's header says them.
fn header(r: &Report, out: &mut String) {
    let s = &r.scenario;
    let _ = writeln!(
        out,
        "<p class=\"meta\">scenario <b>{}</b> ({}) · seed {} · {} {} · {} relays · {} notifiers · \
         {} partitions · inbox {}<br>infra: {} {} {} · {} {} topic {}</p>",
        esc(&s.name),
        esc(&s.path),
        r.seed,
        s.payments,
        esc(&r.shown.driven),
        s.relays,
        s.notifiers,
        s.partitions,
        esc(&s.inbox),
        esc(&r.infra.database),
        esc(&r.infra.database_endpoint),
        esc(&r.infra.schema),
        esc(&r.infra.broker),
        esc(&r.infra.brokers),
        esc(&r.infra.topic),
    );
}

/// The verification, fault and invariant tables.
fn tables(r: &Report, out: &mut String) {
    let (title, verification) = (&r.shown.verification_title, &r.shown.verification);
    section(out, "verification", title, |out| {
        let rows: Vec<Vec<String>> = verification.iter().map(|(k, v)| vec![k.clone(), v.clone()]).collect();
        table(out, &["measure", "value"], &rows);
    });
    section(out, "faults", "Faults", |out| {
        let rows: Vec<Vec<String>> = report::shown_faults(r)
            .map(|f| {
                vec![
                    f.point.clone(),
                    f.rates(),
                    f.unit.clone(),
                    f.occurrences.to_string(),
                    f.fired.to_string(),
                    f.confirmed.to_string(),
                ]
            })
            .collect();
        table(out, &["fault point", "probability", "per", "reached", "fired", "confirmed"], &rows);
        let k = &r.components;
        if !r.shown.components_counted {
            let _ = write!(
                out,
                "<p>processes: {} started, {} killed, {} paused</p>",
                k.processes_started, k.processes_killed, k.processes_paused
            );
        } else {
            let _ = write!(
                out,
                "<p>components: {} relay batches, {} relay crashes, {} notifier crashes, {} duplicates absorbed by \
                 the inbox, {} stale events ignored by the projection, {} relay errors, {} notifier errors</p>",
                k.relay_batches,
                k.relay_crashes,
                k.notifier_crashes,
                k.duplicates_absorbed,
                k.stale_ignored,
                k.relay_errors,
                k.notifier_errors
            );
        }
        let _ = write!(out, "<p>timings: {}</p>", super::timings_line(&r.timings));
    });
    fault_log(r, out);
    section(out, "invariants", "Invariants", |out| {
        let rows: Vec<Vec<String>> = r
            .invariants
            .iter()
            .chain(r.chaos_checks.iter())
            .map(|i| {
                vec![report::judged_mark(r, i.ok).to_string(), i.name.clone(), i.expected.clone(), i.actual.clone()]
            })
            .collect();
        table(out, &["", "invariant", "expected", "actual"], &rows);
    });
}

/// At most this many firings are listed in the fault log's table.
pub const FAULT_ROWS: usize = 200;

/// Every logged firing, in order: when, where, by whom, what it hit and
/// which data it reached; on every page, passing or not.
fn fault_log(r: &Report, out: &mut String) {
    section(out, "fault-log", "Fault log: every firing", |out| {
        let (logged, all) = (r.fault_log.len(), fired(r));
        if logged == 0 {
            match all {
                0 => out.push_str("<p>No fault fired in this run.</p>"),
                n => _ = write!(out, "<p>None of the run's {n} firings was logged.</p>"),
            }
            return;
        }
        let mut note = format!("{logged} firings logged");
        if (logged as u64) < all {
            let _ = write!(note, " (the run keeps the first {logged} of its {all} firings)");
        }
        if logged > FAULT_ROWS {
            let _ = write!(note, "; the first {FAULT_ROWS} are listed, {} more are not shown", logged - FAULT_ROWS);
        }
        let _ = write!(
            out,
            "<p>{note}. <i>reach</i> is the data a firing hit, where its component knows: the outbox seqs of a \
             relay's batch, the topic positions (<code>partition:offsets</code>) of a notifier's.</p>"
        );
        let rows: Vec<Vec<String>> = r
            .fault_log
            .iter()
            .take(FAULT_ROWS)
            .map(|f| {
                vec![
                    format!("{:.3}", seconds(f.at_ms)),
                    f.point.clone(),
                    f.component.clone(),
                    f.hit.clone(),
                    reach(&f.reach),
                ]
            })
            .collect();
        table(out, &["s into the run", "fault point", "component", "what it hit", "reach"], &rows);
    });
}

/// A firing's reach in a few words: "outbox seqs 3–4, 10 · topic 0:5–9".
fn reach(r: &crate::faults::Reach) -> String {
    let run = |a: i64, b: i64| if a == b { a.to_string() } else { format!("{a}–{b}") };
    let mut parts = Vec::new();
    if !r.seqs.is_empty() {
        let seqs: Vec<String> = r.seqs.iter().map(|(a, b)| run(*a, *b)).collect();
        parts.push(format!("outbox seqs {}", seqs.join(", ")));
    }
    if !r.spans.is_empty() {
        let spans: Vec<String> = r.spans.iter().map(|s| s.short()).collect();
        parts.push(format!("topic {}", spans.join(", ")));
    }
    parts.join(" · ")
}

/// The anomalies with their examples, and the faults around each example.
fn anomalies(r: &Report, out: &mut String) {
    section(out, "anomalies", "Anomalies", |out| {
        let rows: Vec<Vec<String>> = r
            .anomalies
            .iter()
            .map(|a| {
                let name = if a.allowed { format!("{} (allowed)", a.name) } else { a.name.clone() };
                vec![name, a.count.to_string(), a.examples.join("\n")]
            })
            .collect();
        let examples = format!("examples (up to {})", crate::verifier::reconcile::EXAMPLES);
        table(out, &["anomaly", "count", &examples], &rows);
        let followed: Vec<Vec<String>> = r
            .anomalies
            .iter()
            .flat_map(|a| a.followed.iter().map(move |f| (a, f)))
            .map(|(a, f)| {
                let suspects = f.suspects("\n");
                vec![a.name.clone(), f.subject.to_string(), format!("{:.3}", seconds(f.trace_ms)), suspects]
            })
            .collect();
        if !followed.is_empty() {
            let _ = write!(out, "<h3>{}</h3>", super::CAUSES);
            table(
                out,
                &["anomaly", "payment or event", "last trace (s into the run)", &super::cause_column()],
                &followed,
            );
        }
    });
}

/// An HTML table; a newline in a cell is a line break.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    out.push_str("<table><thead><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let class = match cell.as_str() {
                "✔" => " class=\"ok\"",
                "✘" => " class=\"bad\"",
                _ => "",
            };
            let _ = write!(out, "<td{class}>{}</td>", esc(cell).replace('\n', "<br>"));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
}

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's style. The verdict's colours are picked for a contrast of at
/// least 4.5 (WCAG's level for text) with white text on them, or on the
/// tiles' grey as text; the browser test measures it. `.verdict.pass`
/// outranks `span.pass` (the sweep page's coloured words), so each badge
/// names its white text with its background.
const STYLE: &str = ":root{--pass:#1e7b1e;--fail:#c0392b;--other:#8a6400}\
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1040px;color:#222}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}\
.verdict{padding:2px 10px;border-radius:4px;color:#fff;font-size:16px}.verdict.pass{background:var(--pass);color:#fff}\
.verdict.fail{background:var(--fail);color:#fff}\
.verdict.inconclusive,.verdict.incomplete,.verdict.interrupted{background:var(--other);color:#fff}\
.harm{border-left:4px solid var(--fail);padding:4px 12px;margin:12px 0}\
.harm dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}.harm dt{grid-column:1;color:#555}\
.harm dd{grid-column:2;margin:0;overflow-wrap:anywhere}.harm dd.first{font-size:18px;font-weight:600;color:var(--fail)}\
.meta,.why{color:#444}table{border-collapse:collapse;margin:8px 0;font-size:13px}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}\
td.ok{color:var(--pass)}td.bad,.bad{color:var(--fail)}.story{border-left:4px solid var(--fail);padding-left:12px;margin:18px 0}\
.msg{display:inline-block;background:#eef;border:1px solid #99c;border-radius:3px;padding:0 5px;margin:2px;\
font-family:monospace;font-size:12px}code{font-size:12px}.chart svg{max-width:100%;height:auto}\
.legend{margin:0 0 6px;font-size:13px}.legend .key{margin-right:16px;white-space:nowrap}\
.legend i{display:inline-block;width:20px;height:3px;vertical-align:middle;margin-right:6px}.legend i.band{height:12px}\
.tiles{display:grid;grid-template-columns:minmax(0,1.8fr) repeat(6,minmax(0,1fr));gap:10px;margin:14px 0}\
@media (max-width:820px){.tiles{grid-template-columns:repeat(auto-fit,minmax(128px,1fr))}#tile-verdict{grid-column:span 2}}\
.tile{border:1px solid #ccc;border-top:5px solid #888;border-radius:6px;padding:8px 10px;background:#fafafa}\
.tile .label{font-size:12px;color:#555;text-transform:uppercase;letter-spacing:.04em}\
.tile .value{font-size:22px;font-weight:600;margin:2px 0;white-space:nowrap}.tile .detail{font-size:12px;color:#555}\
.tile.ok,.tile.pass{border-top-color:var(--pass)}.tile.bad,.tile.fail{border-top-color:var(--fail)}\
.tile.bad .value,.tile.fail .value{color:var(--fail)}.tile.pass .value{color:var(--pass)}\
.codes .code{margin-right:10px;white-space:nowrap}.tile.inconclusive,.tile.incomplete,.tile.interrupted{border-top-color:var(--other)}\
span.pass,td.pass{color:var(--pass)}span.fail,td.fail{color:var(--fail);font-weight:bold}span.other,td.other{color:var(--other)}";
