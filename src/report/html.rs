//! The HTML report, `reports/<run-id>.html`: one self-contained page drawn
//! from the [`Report`] alone (so `chaos report <file.json> --html` draws a
//! saved run again). Nothing is loaded from the network: the styles are
//! inline and the charts are SVG drawn by plotters into the page.
//!
//! - Events written, published and processed over time, each fault a mark
//!   at its time, or a band where the scenario says how long it lasts.
//! - The latency distribution (its buckets; the percentiles in older reports).
//! - The verification, fault and invariant tables of [`crate::report::render`].
//! - Each anomaly example's story on one line of time ([`crate::verifier::story`]).

use crate::error::{Error, Result};
use crate::faults::{FaultPoint, FaultRecord};
use crate::report::{self, Report};
use crate::verifier::story::Story;
use crate::verifier::Verdict;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;
use std::path::Path;

/// The charts' width in pixels; the page is laid out for it.
const WIDTH: u32 = 1000;

/// The size of the charts' text (tick labels, legends, step labels) and of
/// their axis titles, in pixels on the page.
const TEXT_PX: f64 = 13.0;
const TITLE_PX: f64 = 14.0;

/// The width of the charts' left label area: the events chart and the
/// instances' lanes below it share their time axis, aligned.
const LEFT_PX: u32 = 130;

/// A chart font whose text is `px` pixels high on the page: plotters'
/// SVG backend writes a font's size divided by 1.24 (its default of 12
/// came out as 9.7 px, too small to read).
fn font(px: f64) -> FontDesc<'static> {
    FontDesc::new(FontFamily::SansSerif, px * 1.24, FontStyle::Normal)
}

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
            "<p>Sampled every {} ms from the shared counters. Each fault is a vertical mark at its time, \
             or a band where the scenario gives its length, with its point's code above the chart.{note}</p>",
            report::SAMPLE_EVERY_MS
        );
        out.push_str(&chart(|a| throughput(r, a), WIDTH, 380 + CODE_ROWS as u32 * CODE_ROW_PX as u32));
        code_legend(r, out);
    });
    let lanes = instances(r);
    if !lanes.is_empty() {
        section(&mut out, "instances", "Faults by component instance", |out| {
            out.push_str(
                "<p>One lane per instance the scenario starts and per component a fault fired in (its firings \
                 logged in brackets), on the time axis of the chart above: each firing a mark in its point's \
                 colour, with its code where there is room.</p>",
            );
            let h = 24 + 44 + LANE_PX * lanes.len() as u32;
            out.push_str(&chart(|a| instance_lanes(r, &lanes, a), WIDTH, h));
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
                story(r, s, i, out);
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
            out.push_str(&chart(|a| latency(l, a), WIDTH, 300));
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

/// The three tiles of what the run drove and what came of it: a declared
/// system's operations, events and messages, or the payments' receipts.
fn effect_tiles(r: &Report, judged: bool) -> Vec<Tile<'static>> {
    let c = &r.counts;
    let bad = |b: bool| if b { "bad" } else { "ok" };
    let mut out = Vec::new();
    match &r.system {
        Some(f) => {
            out.push((
                "driven",
                "operations",
                f.operations.to_string(),
                format!("{} acknowledged · {} refused · {} ambiguous", f.acknowledged, f.refused, f.ambiguous),
                "",
            ));
            out.push(("effects", "outbox events", f.outbox_events.to_string(), String::new(), ""));
            out.push((
                "messages",
                "messages",
                f.messages.to_string(),
                format!("{} duplicates", f.duplicate_messages),
                "",
            ));
        }
        None => {
            out.push((
                "driven",
                "payments",
                c.payments.to_string(),
                format!("{} captured · {} committed", c.payments_captured, c.payments_committed),
                "",
            ));
            out.push((
                "effects",
                "receipts",
                c.receipts.to_string(),
                format!(
                    "{} payments with several · {} with none",
                    c.payments_with_many_receipts, c.payments_without_receipt
                ),
                bad(judged && c.payments_with_many_receipts + c.payments_without_receipt > 0),
            ));
            out.push((
                "messages",
                "messages",
                c.topic_messages.to_string(),
                format!(
                    "{} duplicates · {} absorbed by the inbox",
                    c.topic_duplicates, r.components.duplicates_absorbed
                ),
                "",
            ));
        }
    }
    out
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
        report::driven(r),
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
    let (title, verification) = report::verification(r);
    section(out, "verification", title, |out| {
        let rows: Vec<Vec<String>> = verification.into_iter().map(|(k, v)| vec![k.to_string(), v]).collect();
        table(out, &["measure", "value"], &rows);
    });
    section(out, "faults", "Faults", |out| {
        let rows: Vec<Vec<String>> = report::shown_faults(r)
            .map(|f| {
                vec![
                    f.point.clone(),
                    f.probability.to_string(),
                    f.unit.clone(),
                    f.occurrences.to_string(),
                    f.fired.to_string(),
                    f.confirmed.to_string(),
                ]
            })
            .collect();
        table(out, &["fault point", "probability", "per", "reached", "fired", "confirmed"], &rows);
        let k = &r.components;
        if r.system.is_some() {
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
        let t = &r.timings;
        let _ = write!(
            out,
            "<p>timings: setup {} ms · workload {} ms · drain {} ms · verify {} ms · total {} ms</p>",
            t.setup_ms, t.workload_ms, t.drain_ms, t.verify_ms, t.total_ms
        );
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
                    format!("{:.3}", f.at_ms as f64 / 1000.0),
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
                vec![a.name.clone(), f.subject.to_string(), format!("{:.3}", f.trace_ms as f64 / 1000.0), suspects]
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

/// One example's story: a chart of its dated steps by lane, its steps as a
/// table, and its messages on the topic.
fn story(r: &Report, s: &Story, i: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "<section class=\"story\" id=\"story-{i}\" data-payment=\"{p}\"><h3>{a} · example {n} · payment <code>{p}</code></h3>",
        a = esc(&s.anomaly),
        n = s.example + 1,
        p = s.payment,
    );
    if let Some(example) = r.anomalies.iter().find(|a| a.name == s.anomaly).and_then(|a| a.examples.get(s.example)) {
        let _ = write!(out, "<p class=\"example\">{}</p>", esc(example));
    }
    if s.steps.is_empty() {
        out.push_str("<p>The database holds no dated row of this payment.</p>");
    } else {
        let layout = layout(s);
        let h = layout.chart_height();
        out.push_str(&chart(|a| timeline(s, &layout, &r.fault_log, &r.fault_spans_ms, a), WIDTH, h));
    }
    out.push_str("<p class=\"topic\">on the topic: ");
    if s.messages.is_empty() {
        out.push_str("no message carries this payment's key");
    }
    for m in &s.messages {
        let _ = write!(out, "<span class=\"msg\">{} {}</span> ", m.at, esc(&m.kind));
    }
    out.push_str("</p>\n");
    // The steps, and the faults of the chart's window among them.
    let mut rows: Vec<(i64, Vec<String>)> = s
        .steps
        .iter()
        .map(|t| {
            let event = t.event.map(|e| e.to_string()).unwrap_or_default();
            (t.at_ms, vec![t.lane.clone(), t.what.clone(), event])
        })
        .collect();
    if let Some((first, last)) = window(s) {
        for f in r.fault_log.iter().filter(|f| (first..=last).contains(&(f.at_ms as i64))) {
            let what = format!("{} on {}: {}", f.point, f.component, f.hit);
            rows.push((f.at_ms as i64, vec!["fault".into(), what, String::new()]));
        }
    }
    rows.sort_by_key(|(at, _)| *at);
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(at, mut row)| {
            row.insert(0, format!("{:.3}", at as f64 / 1000.0));
            row
        })
        .collect();
    table(out, &["s into the run", "where", "what", "event or message"], &rows);
    out.push_str("</section>\n");
}

/// Draws one chart into an SVG string; a drawing error becomes a line of
/// text in the page (the rest of the report stands without the chart).
fn chart<F>(draw: F, w: u32, h: u32) -> String
where
    F: FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String>,
{
    let mut svg = String::new();
    let drawn = {
        let area = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        draw(&area).and_then(|_| area.present().map_err(|e| e.to_string()))
    };
    match drawn {
        Ok(()) => format!("<div class=\"chart\">{svg}</div>\n"),
        Err(e) => {
            tracing::warn!(cause = %e, "drawing a chart of the HTML report failed");
            format!("<p class=\"bad\">the chart could not be drawn: {}</p>\n", esc(&e))
        }
    }
}

/// A fault's colour by what it struck: the relay, the notifier, the
/// payment service, or the infrastructure (proxy, broker, database, processes).
fn fault_colour(point: &str) -> RGBColor {
    match point.split('.').next() {
        Some("relay") => RGBColor(230, 120, 0),
        Some("notifier") => RGBColor(200, 30, 30),
        Some("workload") => RGBColor(130, 60, 170),
        _ => RGBColor(90, 90, 90),
    }
}

const FAULT_KINDS: [(&str, &str); 4] = [
    ("relay", "relay faults"),
    ("notifier", "notifier faults"),
    ("workload", "payment service"),
    ("infra", "infrastructure"),
];

/// Written, published and processed over time, with the faults.
fn throughput(r: &Report, area: &DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let x_end = time_end(r);
    let top = r.series.iter().map(|s| s.written.max(s.published).max(s.applied)).max().unwrap_or(0).max(10);
    let y_top = top as f64 * 1.05;
    let mut c = ChartBuilder::on(area)
        .margin(12)
        .margin_top(12 + CODE_ROWS as i32 * CODE_ROW_PX + 6)
        .x_label_area_size(44)
        .y_label_area_size(LEFT_PX)
        .build_cartesian_2d(0f64..x_end, 0f64..y_top)
        .map_err(e)?;
    c.configure_mesh()
        .label_style(font(TEXT_PX))
        .axis_desc_style(font(TITLE_PX))
        .x_desc("seconds into the run")
        .y_desc("count")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    fault_marks(&mut c, &r.fault_log, &r.fault_spans_ms, y_top).map_err(e)?;
    code_labels(area, &c, &r.fault_log, y_top).map_err(e)?;
    let lines = [
        ("payments written", RGBColor(31, 119, 180), (|s: &report::Sample| s.written) as fn(&report::Sample) -> u64),
        ("messages published", RGBColor(44, 160, 44), |s| s.published),
        ("events processed", RGBColor(148, 103, 189), |s| s.applied),
    ];
    for (label, colour, value) in lines {
        let points = r.series.iter().map(|s| (s.at_ms as f64 / 1000.0, value(s) as f64));
        c.draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    for (kind, label) in FAULT_KINDS {
        if r.fault_log.iter().any(|f| fault_kind(&f.point) == kind) {
            let colour = fault_colour(if kind == "infra" { "net" } else { kind });
            c.draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                .map_err(e)?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], colour.mix(0.5).filled()));
        }
    }
    c.configure_series_labels()
        .label_font(font(TEXT_PX))
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(e)?;
    Ok(())
}

fn fault_kind(point: &str) -> &'static str {
    FaultPoint::from_name(point).and_then(|p| p.strike().component()).unwrap_or("infra")
}

/// Each logged fault as a vertical mark, or a band where its length is known.
fn fault_marks<DB: DrawingBackend>(
    c: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    log: &[FaultRecord],
    spans: &std::collections::BTreeMap<String, u64>,
    y_top: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let bands = log.iter().filter_map(|f| spans.get(&f.point).map(|len| (f, *len)));
    c.draw_series(bands.map(|(f, len)| {
        let (a, b) = (f.at_ms as f64 / 1000.0, (f.at_ms + len) as f64 / 1000.0);
        Rectangle::new([(a, 0.0), (b, y_top)], fault_colour(&f.point).mix(0.18).filled())
    }))?;
    // A band is named at its top as well as by its code above the chart.
    let bands = log.iter().filter_map(|f| spans.get(&f.point).map(|len| (f, *len)));
    c.draw_series(bands.map(|(f, _)| {
        let font = font(TEXT_PX).color(&fault_colour(&f.point));
        Text::new(format!(" {}", f.point), (f.at_ms as f64 / 1000.0, y_top * 0.98), font)
    }))?;
    let marks = log.iter().filter(|f| !spans.contains_key(&f.point));
    c.draw_series(marks.map(|f| {
        let x = f.at_ms as f64 / 1000.0;
        PathElement::new(vec![(x, 0.0), (x, y_top)], fault_colour(&f.point).mix(0.7).stroke_width(2))
    }))?;
    Ok(())
}

/// Rows of fault codes above the events chart, and their height in pixels.
const CODE_ROWS: usize = 6;
const CODE_ROW_PX: i32 = 16;

/// A short code per fault point that fired, in the order of their first
/// firing: A, B, … Z, then A2, B2, …; the page's legend names them.
fn fault_codes(log: &[FaultRecord]) -> Vec<(&str, String)> {
    let mut codes: Vec<(&str, String)> = Vec::new();
    for f in log {
        if !codes.iter().any(|(p, _)| *p == f.point) {
            let i = codes.len();
            let letter = (b'A' + (i % 26) as u8) as char;
            let code = if i < 26 { letter.to_string() } else { format!("{letter}{}", i / 26 + 1) };
            codes.push((&f.point, code));
        }
    }
    codes
}

/// The legend of the fault codes, in HTML under the events chart.
fn code_legend(r: &Report, out: &mut String) {
    let codes = fault_codes(&r.fault_log);
    if codes.is_empty() {
        return;
    }
    out.push_str("<p class=\"codes\">Fault marks: ");
    for (point, code) in &codes {
        let RGBColor(red, green, blue) = fault_colour(point);
        let n = r.fault_log.iter().filter(|f| f.point == *point).count();
        let _ = write!(
            out,
            "<span class=\"code\" style=\"color:#{red:02x}{green:02x}{blue:02x}\"><b>{code}</b> {} × {n}</span> ",
            esc(point)
        );
    }
    out.push_str("</p>\n");
}

/// Above the chart, each fault's code over its mark, staggered in rows
/// so that codes close in time do not cover each other (when every row
/// is taken there, the one free soonest takes it).
fn code_labels<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: &ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    log: &[FaultRecord],
    y_top: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let codes = fault_codes(log);
    let mut order: Vec<&FaultRecord> = log.iter().collect();
    order.sort_by_key(|f| f.at_ms);
    let mut row_end = [i32::MIN; CODE_ROWS];
    for f in order {
        let code = codes.iter().find(|(p, _)| *p == f.point).map_or("?", |(_, c)| c.as_str());
        let (x, top) = c.backend_coord(&(f.at_ms as f64 / 1000.0, y_top));
        let half = (code.chars().count() as f64 * TEXT_PX * 0.35) as i32 + 2;
        let row = (0..CODE_ROWS)
            .find(|k| row_end[*k] + 2 <= x - half)
            .unwrap_or_else(|| (0..CODE_ROWS).min_by_key(|k| row_end[*k]).unwrap_or(0));
        row_end[row] = x + half;
        let y = top - 12 - CODE_ROW_PX * row as i32;
        let colour = fault_colour(&f.point);
        let style = TextStyle::from(font(TEXT_PX)).color(&colour).pos(Pos::new(HPos::Center, VPos::Center));
        area.draw(&Text::new(code.to_string(), (x, y), style))?;
        area.draw(&PathElement::new(vec![(x, y + 7), (x, top)], colour.mix(0.35).stroke_width(1)))?;
    }
    Ok(())
}

/// The height of an instance's lane, in pixels.
const LANE_PX: u32 = 34;

/// The component instances of a run: the relays and notifiers the
/// scenario starts (unless a program under test is started in their
/// place) and every component a fault fired in, the payment service
/// first, then relays, notifiers and the rest, each by its number.
fn instances(r: &Report) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if r.system.is_none() {
        if r.scenario.relay_command.is_none() {
            names.extend((1..=r.scenario.relays).map(|i| format!("relay-{i}")));
        }
        if r.scenario.notifier_command.is_none() {
            names.extend((1..=r.scenario.notifiers).map(|i| format!("notifier-{i}")));
        }
    }
    for f in &r.fault_log {
        if !names.contains(&f.component) {
            names.push(f.component.clone());
        }
    }
    let key = |name: &String| {
        let (kind, n) = name
            .rsplit_once('-')
            .and_then(|(kind, n)| n.parse::<u64>().ok().map(|n| (kind.to_string(), n)))
            .unwrap_or_else(|| (name.clone(), 0));
        let rank = ["workload", "relay", "notifier"].iter().position(|k| *k == kind).unwrap_or(3);
        (rank, kind, n)
    };
    names.sort_by_cached_key(key);
    names
}

/// The end of the events chart's time axis, in seconds: its last sample
/// or fault, at least one second.
fn time_end(r: &Report) -> f64 {
    let end_ms = r
        .series
        .last()
        .map(|s| s.at_ms)
        .unwrap_or(0)
        .max(r.fault_log.iter().map(|f| f.at_ms).max().unwrap_or(0))
        .max(1000);
    end_ms as f64 / 1000.0
}

/// A lane per component instance, top to bottom, with its firings: a
/// mark at each (a band where the scenario gives its length), its code
/// above it when that does not cover the code before.
fn instance_lanes(
    r: &Report,
    lanes: &[String],
    area: &DrawingArea<SVGBackend<'_>, Shift>,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let n = lanes.len() as f64;
    let x_end = time_end(r);
    let mut c = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(LEFT_PX)
        .build_cartesian_2d(0f64..x_end, 0f64..n)
        .map_err(e)?;
    c.configure_mesh()
        .label_style(font(TEXT_PX))
        .axis_desc_style(font(TITLE_PX))
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("seconds into the run")
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    // Lane i spans [n-1-i, n-i] on the y axis; every other one is shaded.
    let bottom = |i: usize| n - 1.0 - i as f64;
    c.draw_series(
        (0..lanes.len())
            .filter(|i| i % 2 == 0)
            .map(|i| Rectangle::new([(0.0, bottom(i)), (x_end, bottom(i) + 1.0)], BLACK.mix(0.05).filled())),
    )
    .map_err(e)?;
    let codes = fault_codes(&r.fault_log);
    let mut last_code = vec![i32::MIN; lanes.len()];
    for (i, name) in lanes.iter().enumerate() {
        let fired = r.fault_log.iter().filter(|f| f.component == *name).count();
        let (x, y) = c.backend_coord(&(0.0, bottom(i) + 0.5));
        let style = TextStyle::from(font(TEXT_PX)).pos(Pos::new(HPos::Right, VPos::Center));
        area.draw(&Text::new(format!("{name} ({fired})"), (x - 8, y), style)).map_err(e)?;
    }
    let mut log: Vec<&FaultRecord> = r.fault_log.iter().collect();
    log.sort_by_key(|f| f.at_ms);
    for f in log {
        let Some(i) = lanes.iter().position(|l| *l == f.component) else { continue };
        let (a, y) = (f.at_ms as f64 / 1000.0, bottom(i));
        let colour = fault_colour(&f.point);
        match r.fault_spans_ms.get(&f.point) {
            Some(len) => c.draw_series(std::iter::once(Rectangle::new(
                [(a, y + 0.1), (a + *len as f64 / 1000.0, y + 0.5)],
                colour.mix(0.35).filled(),
            ))),
            None => c.draw_series(std::iter::once(PathElement::new(
                vec![(a, y + 0.1), (a, y + 0.5)],
                colour.stroke_width(3),
            ))),
        }
        .map_err(e)?;
        let code = codes.iter().find(|(p, _)| *p == f.point).map_or("?", |(_, c)| c.as_str());
        let (x, top) = c.backend_coord(&(a, y + 0.75));
        let half = (code.chars().count() as f64 * TEXT_PX * 0.35) as i32 + 2;
        if last_code[i] + 2 <= x - half {
            last_code[i] = x + half;
            let style = TextStyle::from(font(TEXT_PX)).color(&colour).pos(Pos::new(HPos::Center, VPos::Center));
            area.draw(&Text::new(code.to_string(), (x, top), style)).map_err(e)?;
        }
    }
    Ok(())
}

/// A report from before the latency buckets: its percentiles as bars.
fn percentile_bars(l: &report::Latency, area: &DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let bar = RGBColor(31, 119, 180);
    let ps = [("p50", l.p50), ("p95", l.p95), ("p99", l.p99), ("max", l.max)];
    let top = l.max.max(1.0) * 1.1;
    let mut c = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..4f64, 0f64..top)
        .map_err(e)?;
    c.configure_mesh()
        .label_style(font(TEXT_PX))
        .axis_desc_style(font(TITLE_PX))
        .disable_x_mesh()
        .x_labels(4)
        .x_label_formatter(&|x| ps.get(x.floor() as usize).map_or(String::new(), |p| p.0.to_string()))
        .y_desc("ms")
        .draw()
        .map_err(e)?;
    c.draw_series(
        ps.iter()
            .enumerate()
            .map(|(i, (_, v))| Rectangle::new([(i as f64 + 0.2, 0.0), (i as f64 + 0.8, *v)], bar.filled())),
    )
    .map_err(e)?;
    Ok(())
}

/// The latency buckets as bars on a logarithmic axis, with the
/// percentiles marked; a report from before the buckets gets its
/// percentiles as bars.
fn latency(l: &report::Latency, area: &DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let bar = RGBColor(31, 119, 180);
    if l.buckets.is_empty() {
        return percentile_bars(l, area);
    }
    // A bucket spans (the previous one's bound, its own]; on the log axis the
    // 0 ms bucket is drawn just left of 1 ms.
    const ZERO: f64 = 0.25;
    let bounds = |b: &report::LatencyBucket| (b.up_to_ms as f64).max(ZERO * 2.0);
    let lows: Vec<f64> = std::iter::once(ZERO).chain(l.buckets.iter().map(bounds)).collect();
    // From the first bucket with events to a little past the last.
    let lo = l.buckets.iter().zip(&lows).find(|(b, _)| b.events > 0).map_or(ZERO, |(_, low)| *low);
    let hi = l.buckets.last().map_or(2.0, |b| bounds(b).max(2.0)) * 1.2;
    let top = l.buckets.iter().map(|b| b.events).max().unwrap_or(1) as f64 * 1.1;
    let mut c = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..top)
        .map_err(e)?;
    c.configure_mesh()
        .label_style(font(TEXT_PX))
        .axis_desc_style(font(TITLE_PX))
        .x_desc("latency, ms (each bar twice as wide as the one before)")
        .y_desc("events")
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    c.draw_series(
        l.buckets
            .iter()
            .zip(lows.iter().copied())
            .filter(|(b, _)| b.events > 0)
            .map(|(b, low)| Rectangle::new([(low, 0.0), (bounds(b), b.events as f64)], bar.mix(0.8).filled())),
    )
    .map_err(e)?;
    for (name, v, colour) in [
        ("p50", l.p50, RGBColor(44, 160, 44)),
        ("p99", l.p99, RGBColor(230, 120, 0)),
        ("max", l.max, RGBColor(200, 30, 30)),
    ] {
        let x = v.max(lo);
        c.draw_series(std::iter::once(PathElement::new(vec![(x, 0.0), (x, top)], colour.stroke_width(2))))
            .map_err(e)?
            .label(format!("{name} {v:.0} ms"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    c.configure_series_labels()
        .label_font(font(TEXT_PX))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(e)?;
    Ok(())
}

/// The span of a story's chart in ms: its steps, with a margin on each
/// side of a tenth of the story, at least 100 ms.
fn window(s: &Story) -> Option<(i64, i64)> {
    let first = s.steps.iter().map(|t| t.at_ms).min()?;
    let last = s.steps.iter().map(|t| t.at_ms).max()?;
    let pad = ((last - first) / 10).max(100);
    Some((first - pad, last + pad))
}

/// The lanes of a story, top to bottom.
const LANES: [&str; 6] = ["payment", "outbox", "delivery", "inbox", "effect", "provider"];

/// A story chart's margin, its lane names' width, and its time axis's
/// height, in pixels: where its plot is on the page.
const STORY_MARGIN: i32 = 10;
const STORY_LEFT: i32 = 90;
const STORY_AXIS: i32 = 44;
/// The height of a row of step labels, and the padding of a lane.
const STEP_ROW_PX: i32 = 18;
const LANE_PAD_PX: i32 = 8;

/// About how wide a chart label is in pixels (a sans-serif letter is
/// about 0.6 of its height; a little more here to be safe).
fn text_width(s: &str) -> i32 {
    (s.chars().count() as f64 * TEXT_PX * 0.62).ceil() as i32
}

/// Where a story's steps are drawn: in its lane, in the first row where
/// its dot and label cover no other step's, the label right of its dot
/// unless it would leave the chart there.
struct Layout<'a> {
    /// Step, its lane, x in pixels, its row in the lane, its label on the left.
    steps: Vec<(&'a crate::verifier::story::Step, usize, i32, usize, bool)>,
    /// Each lane's top (pixels below the plot's top) and height.
    lanes: Vec<(i32, i32)>,
}

impl Layout<'_> {
    /// The plot's height, in pixels.
    fn height(&self) -> i32 {
        self.lanes.last().map_or(0, |(top, h)| top + h)
    }

    /// The whole chart's height, in pixels.
    fn chart_height(&self) -> u32 {
        (2 * STORY_MARGIN + STORY_AXIS + self.height()) as u32
    }

    /// The centre of row `row` of lane `lane`, in pixels below the plot's top.
    fn row_y(&self, lane: usize, row: usize) -> i32 {
        self.lanes[lane].0 + LANE_PAD_PX / 2 + STEP_ROW_PX / 2 + STEP_ROW_PX * row as i32
    }
}

fn layout(s: &Story) -> Layout<'_> {
    let (first, last) = window(s).unwrap_or((0, 1000));
    let (left, right) = (STORY_MARGIN + STORY_LEFT, WIDTH as i32 - STORY_MARGIN);
    let px = |at: i64| left + ((at - first) as f64 / (last - first).max(1) as f64 * (right - left) as f64) as i32;
    let mut rows: Vec<Vec<Vec<(i32, i32)>>> = vec![Vec::new(); LANES.len()];
    let mut steps = Vec::with_capacity(s.steps.len());
    let mut ordered: Vec<_> = s.steps.iter().collect();
    ordered.sort_by_key(|t| t.at_ms);
    for t in ordered {
        let lane = LANES.iter().position(|l| *l == t.lane).unwrap_or(LANES.len() - 1);
        let (x, w) = (px(t.at_ms), text_width(&t.what));
        let on_left = x + 8 + w > right && x - 8 - w >= left;
        let span = if on_left { (x - 8 - w - 3, x + 6) } else { (x - 6, x + 8 + w + 3) };
        let free = |row: &Vec<(i32, i32)>| row.iter().all(|(a, b)| span.1 <= *a || *b <= span.0);
        let row = match rows[lane].iter().position(free) {
            Some(row) => row,
            None => {
                rows[lane].push(Vec::new());
                rows[lane].len() - 1
            }
        };
        rows[lane][row].push(span);
        steps.push((t, lane, x, row, on_left));
    }
    let mut lanes = Vec::with_capacity(LANES.len());
    let mut top = 0;
    for r in &rows {
        let h = r.len().max(1) as i32 * STEP_ROW_PX + LANE_PAD_PX;
        lanes.push((top, h));
        top += h;
    }
    Layout { steps, lanes }
}

/// One story's dated steps, a lane per kind of step, with the faults in
/// its window. A lane has as many rows as its labels need not to overlap.
fn timeline(
    s: &Story,
    layout: &Layout<'_>,
    log: &[FaultRecord],
    spans: &std::collections::BTreeMap<String, u64>,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let (first, last) = window(s).unwrap_or((0, 1000));
    let (x0, x1) = (first as f64 / 1000.0, last as f64 / 1000.0);
    let h = layout.height() as f64;
    let mut c = ChartBuilder::on(area)
        .margin(STORY_MARGIN)
        .x_label_area_size(STORY_AXIS)
        .y_label_area_size(STORY_LEFT)
        .build_cartesian_2d(x0..x1, 0f64..h)
        .map_err(e)?;
    c.configure_mesh()
        .label_style(font(TEXT_PX))
        .axis_desc_style(font(TITLE_PX))
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("seconds into the run")
        .light_line_style(WHITE)
        .draw()
        .map_err(e)?;
    // The plot's y axis counts pixels up from its bottom; the layout's, down from its top.
    c.draw_series(layout.lanes.iter().enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, (top, lh))| {
        Rectangle::new([(x0, h - (top + lh) as f64), (x1, h - *top as f64)], BLACK.mix(0.04).filled())
    }))
    .map_err(e)?;
    let window: Vec<&FaultRecord> = log
        .iter()
        .filter(|f| {
            let (a, b) = (f.at_ms as i64, f.at_ms as i64 + spans.get(&f.point).copied().unwrap_or(0) as i64);
            b >= first && a <= last
        })
        .collect();
    c.draw_series(window.iter().map(|f| {
        let (a, len) = (f.at_ms as f64 / 1000.0, spans.get(&f.point).copied().unwrap_or(0) as f64 / 1000.0);
        Rectangle::new([(a.max(x0), 0.0), ((a + len).min(x1).max(a + (x1 - x0) / 400.0), h)], {
            fault_colour(&f.point).mix(if len > 0.0 { 0.15 } else { 0.5 }).filled()
        })
    }))
    .map_err(e)?;
    let plot_top = STORY_MARGIN;
    for (i, name) in LANES.iter().enumerate() {
        let (top, lh) = layout.lanes[i];
        let style = TextStyle::from(font(TEXT_PX)).pos(Pos::new(HPos::Right, VPos::Center));
        let at = (STORY_MARGIN + STORY_LEFT - 8, plot_top + top + lh / 2);
        area.draw(&Text::new(name.to_string(), at, style)).map_err(e)?;
    }
    for (t, lane, x, row, on_left) in &layout.steps {
        let colour = match t.lane.as_str() {
            "payment" => RGBColor(31, 119, 180),
            "outbox" => RGBColor(44, 160, 44),
            "delivery" => RGBColor(23, 150, 170),
            "inbox" => RGBColor(148, 103, 189),
            "provider" => RGBColor(255, 127, 14),
            _ => RGBColor(200, 30, 30),
        };
        let y = plot_top + layout.row_y(*lane, *row);
        let (dx, hpos) = if *on_left { (-8, HPos::Right) } else { (8, HPos::Left) };
        let style = TextStyle::from(font(TEXT_PX)).pos(Pos::new(hpos, VPos::Center));
        area.draw(&Circle::new((*x, y), 5, colour.filled())).map_err(e)?;
        area.draw(&Text::new(t.what.clone(), (x + dx, y), style)).map_err(e)?;
    }
    Ok(())
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

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1040px;color:#222}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}\
.verdict{padding:2px 10px;border-radius:4px;color:#fff;font-size:16px}.verdict.pass{background:#2a8a2a}\
.verdict.fail{background:#c0392b}.verdict.inconclusive,.verdict.incomplete,.verdict.interrupted{background:#b8860b}\
.meta,.why{color:#444}table{border-collapse:collapse;margin:8px 0;font-size:13px}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}\
td.ok{color:#2a8a2a}td.bad,.bad{color:#c0392b}.story{border-left:4px solid #c0392b;padding-left:12px;margin:18px 0}\
.msg{display:inline-block;background:#eef;border:1px solid #99c;border-radius:3px;padding:0 5px;margin:2px;\
font-family:monospace;font-size:12px}code{font-size:12px}.chart svg{max-width:100%;height:auto}\
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(128px,1fr));gap:10px;margin:14px 0}\
.tile{border:1px solid #ccc;border-top:5px solid #888;border-radius:6px;padding:8px 10px;background:#fafafa}\
.tile .label{font-size:12px;color:#555;text-transform:uppercase;letter-spacing:.04em}\
.tile .value{font-size:22px;font-weight:600;margin:2px 0;white-space:nowrap}.tile .detail{font-size:12px;color:#555}\
.tile.ok,.tile.pass{border-top-color:#2a8a2a}.tile.bad,.tile.fail{border-top-color:#c0392b}\
.tile.bad .value,.tile.fail .value{color:#c0392b}.tile.pass .value{color:#2a8a2a}\
.codes .code{margin-right:10px;white-space:nowrap}.tile.inconclusive,.tile.incomplete,.tile.interrupted{border-top-color:#b8860b}\
span.pass,td.pass{color:#2a8a2a}span.fail,td.fail{color:#c0392b;font-weight:bold}span.other,td.other{color:#b26a00}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_from_before_the_charts_still_draws() {
        // The sample report predates the series, the latency buckets and
        // the stories: the page draws its percentiles and its tables.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/sample-payments-postgres-kafka.json");
        let r = Report::load(&path).unwrap();
        assert!(r.series.is_empty() && r.stories.is_empty());
        let page = render(&r);
        assert_eq!(page.matches("<svg").count(), 3, "the events chart, the instances' lanes and the percentiles");
        assert!(page.contains(&format!("chaos run {}", r.run_id)));
        assert!(page.contains("<section id=\"invariants\">") && page.contains("</html>"));
        assert!(!page.contains("the chart could not be drawn"));
    }

    /// The sample report with what a recent run adds: samples, latency
    /// buckets, a fault log of several instances with reach, and a story
    /// whose steps crowd together.
    pub(crate) fn busy() -> Report {
        use crate::verifier::story::{Step, TopicMessage};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/sample-payments-postgres-kafka.json");
        let mut r = Report::load(&path).unwrap();
        r.series = (0..40)
            .map(|i| report::Sample { at_ms: i * 250, written: i * 25, published: i * 24, applied: i * 23 })
            .collect();
        if let Some(l) = &mut r.latency_ms {
            l.buckets = (0..12).map(|i| report::LatencyBucket { up_to_ms: 1 << i, events: 10 * i }).collect();
        }
        for (i, f) in r.fault_log.iter_mut().enumerate() {
            if i % 3 == 0 {
                f.reach.seqs = vec![(3, 4), (10, 10)];
            } else {
                f.reach.spans = vec![(0, 5, 9).into(), (2, 1, 1).into()];
            }
        }
        let step = |at_ms, lane: &str, what: &str| Step { at_ms, lane: lane.into(), what: what.into(), event: None };
        r.stories = vec![crate::verifier::story::Story {
            anomaly: "duplicate effect".into(),
            example: 0,
            subject: uuid::Uuid::nil(),
            payment: uuid::Uuid::nil(),
            steps: vec![
                step(100, "payment", "payment created"),
                step(102, "payment", "payment captured"),
                step(104, "outbox", "authorized row written"),
                step(105, "outbox", "captured row written"),
                step(300, "outbox", "authorized row published (seq 3)"),
                step(301, "outbox", "captured row published (seq 4)"),
                step(320, "delivery", "authorized 0:5 to notifier-1"),
                step(321, "delivery", "captured 0:6 to notifier-1"),
                step(322, "delivery", "captured 0:6 to notifier-2"),
                step(900, "delivery", "captured 0:6 to notifier-1"),
                step(330, "effect", "receipt sent"),
                step(331, "effect", "receipt sent"),
                step(905, "effect", "receipt sent"),
            ],
            messages: vec![TopicMessage { at: (0, 5).into(), kind: "authorized".into() }],
            seqs: vec![3, 4],
        }];
        r
    }

    /// Every `<text>` of the page's charts: its font size and its words.
    fn chart_texts(page: &str) -> Vec<(f64, String)> {
        page.split("<text")
            .skip(1)
            .map(|t| {
                let size =
                    t.split("font-size=\"").nth(1).and_then(|v| v.split('"').next()).and_then(|v| v.parse().ok());
                let words = t.split('>').nth(1).and_then(|v| v.split('<').next()).unwrap_or_default();
                (size.unwrap_or(0.0), words.trim().to_string())
            })
            .collect()
    }

    #[test]
    fn chart_text_is_at_least_12_pixels() {
        let page = render(&busy());
        let texts = chart_texts(&page);
        assert!(texts.len() > 50, "the charts have text: {texts:?}");
        for (size, words) in texts {
            assert!(size >= 12.0, "{words:?} is {size} px");
        }
    }

    /// The value shown on a tile of the page.
    fn tile<'a>(page: &'a str, id: &str) -> &'a str {
        let at = page.find(&format!("id=\"tile-{id}\"")).unwrap_or_else(|| panic!("no tile {id}"));
        let value = &page[at..][page[at..].find("class=\"value\">").unwrap() + 14..];
        &value[..value.find('<').unwrap()]
    }

    #[test]
    fn the_tiles_sum_up_the_run() {
        let mut r = busy();
        let page = render(&r);
        assert!(page.find("id=\"summary\"").unwrap() < page.find("id=\"throughput\"").unwrap(), "tiles first");
        assert_eq!(tile(&page, "verdict"), "PASS");
        assert_eq!(tile(&page, "driven"), "1000");
        assert_eq!(tile(&page, "effects"), "1000");
        assert_eq!(tile(&page, "messages"), "2157");
        assert_eq!(tile(&page, "faults"), "34");
        assert_eq!(tile(&page, "invariants"), "28/28");
        assert_eq!(tile(&page, "latency"), "1401 ms");
        r.invariants[3].ok = false;
        r.verdict = Verdict::Fail;
        r.latency_ms = None;
        let page = render(&r);
        assert_eq!(tile(&page, "verdict"), "FAIL");
        assert_eq!(tile(&page, "invariants"), "27/28");
        assert!(page.contains("class=\"tile bad\" id=\"tile-invariants\""));
        assert_eq!(tile(&page, "latency"), "–");
        r.verdict = Verdict::Incomplete;
        assert_eq!(tile(&render(&r), "invariants"), "–/28", "an unjudged run holds and breaks nothing");
    }

    /// The rows of the table in `<section id="{id}">`.
    fn rows_in(page: &str, id: &str) -> Vec<String> {
        let at = page.find(&format!("<section id=\"{id}\"")).unwrap_or_else(|| panic!("no section {id}"));
        let sec = &page[at..at + page[at..].find("</section>").unwrap()];
        let body = &sec[sec.find("<tbody>").expect("a table")..];
        body.split("<tr>").skip(1).map(|r| r.to_string()).collect()
    }

    #[test]
    fn the_fault_log_lists_every_firing_up_to_its_cap() {
        let mut r = busy();
        let rows = rows_in(&render(&r), "fault-log");
        assert_eq!(rows.len(), r.fault_log.len());
        assert!(rows[0].contains("<td>0.133</td><td>relay.after_produce</td><td>relay-2</td>"), "{}", rows[0]);
        assert!(rows[0].contains("<td>outbox seqs 3–4, 10</td>"), "{}", rows[0]);
        assert!(rows[1].contains("<td>topic 0:5–9, 2:1</td>"), "{}", rows[1]);
        let first = r.fault_log[0].clone();
        r.fault_log = (0..FAULT_ROWS + 7).map(|_| first.clone()).collect();
        let page = render(&r);
        assert_eq!(rows_in(&page, "fault-log").len(), FAULT_ROWS);
        assert!(page.contains("7 more are not shown"));
        r.fault_log.clear();
        r.faults.iter_mut().for_each(|f| f.fired = 0);
        assert!(render(&r).contains("No fault fired in this run."));
    }

    /// The page from `<section id="{id}"` (or `class="{id}"`) to its end.
    fn section_of<'a>(page: &'a str, id: &str) -> &'a str {
        let at = page.find(&format!("<section id=\"{id}\"")).unwrap_or_else(|| panic!("no section {id}"));
        &page[at..at + page[at..].find("</section>").unwrap()]
    }

    #[test]
    fn each_instance_has_a_lane_and_each_fault_mark_its_code() {
        let r = busy();
        let page = render(&r);
        let lanes = section_of(&page, "instances");
        let texts: Vec<String> = chart_texts(lanes).into_iter().map(|(_, w)| w).collect();
        let mut names: Vec<&str> = r.fault_log.iter().map(|f| f.component.as_str()).collect();
        names.extend(["relay-1", "notifier-1"]);
        names.sort();
        names.dedup();
        for name in names {
            let n = r.fault_log.iter().filter(|f| f.component == name).count();
            let lane = format!("{name} ({n})");
            assert_eq!(texts.iter().filter(|t| **t == lane).count(), 1, "one lane {lane:?} in {texts:?}");
        }
        assert_eq!(instances(&r)[..2], ["relay-1".to_string(), "relay-2".to_string()], "{:?}", instances(&r));
        // Each mark of the events chart has its code above it, and the legend names each code.
        let codes = fault_codes(&r.fault_log);
        let chart = section_of(&page, "throughput");
        let labels = chart_texts(chart).into_iter().filter(|(_, w)| codes.iter().any(|(_, c)| c == w)).count();
        assert_eq!(labels, r.fault_log.len());
        for (point, code) in codes {
            assert!(chart.contains(&format!("<b>{code}</b> {point} × ")), "the legend names {code}");
        }
    }

    /// Each unrotated `<text>` of an SVG as the box it covers (left, top,
    /// right, bottom; a letter about 0.6 of the size wide) and its words.
    fn text_boxes(svg: &str) -> Vec<([f64; 4], String)> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let tag = &t[..t.find('>')?];
                let attr = |name: &str| tag.split(&format!(" {name}=\"")).nth(1).and_then(|v| v.split('"').next());
                if attr("transform").is_some() {
                    return None;
                }
                let num = |name: &str| attr(name).and_then(|v| v.parse::<f64>().ok());
                let (x, y, size) = (num("x")?, num("y")?, num("font-size")?);
                let words = t[t.find('>')? + 1..].split('<').next()?.trim().to_string();
                let w = words.chars().count() as f64 * size * 0.6;
                let left = match attr("text-anchor") {
                    Some("end") => x - w,
                    Some("middle") => x - w / 2.0,
                    _ => x,
                };
                let top = match attr("dy") {
                    Some("0.76em") => y,
                    Some("-0.5ex") => y - size,
                    _ => y - size / 2.0,
                };
                Some(([left, top, left + w, top + size], words))
            })
            .collect()
    }

    /// The first pair of boxes that overlap, if any.
    fn overlap(boxes: &[([f64; 4], String)]) -> Option<(String, String)> {
        for (i, (a, aw)) in boxes.iter().enumerate() {
            for (b, bw) in &boxes[i + 1..] {
                if a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3] {
                    return Some((aw.clone(), bw.clone()));
                }
            }
        }
        None
    }

    #[test]
    fn story_labels_do_not_overlap() {
        let mut r = busy();
        r.anomalies.push(crate::verifier::Anomaly {
            name: "duplicate effect".into(),
            count: 1,
            examples: vec!["payment 0: 3 receipts".into()],
            allowed: false,
            subjects: vec![],
            followed: vec![],
        });
        let page = render(&r);
        let story = &page[page.find("<section class=\"story\"").unwrap()..];
        let svg = &story[..story.find("</svg>").unwrap()];
        let boxes = text_boxes(svg);
        for step in &r.stories[0].steps {
            assert!(boxes.iter().any(|(_, w)| *w == step.what), "no label {:?}", step.what);
        }
        assert_eq!(overlap(&boxes), None, "labels over each other");
        assert!(overlap(&[([0.0, 0.0, 10.0, 10.0], "a".into()), ([5.0, 5.0, 20.0, 20.0], "b".into())]).is_some());
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
    }
}
