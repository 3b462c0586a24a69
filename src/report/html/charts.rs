//! The run's charts: the events over time with each fault marked and
//! coded above, the instances' lanes of firings below it (both on the
//! page's one [`TimeAxis`]), and the latency distribution; and what every
//! chart of the page shares: its width, its fonts, the faults' colours
//! and [`chart`], which draws one into the page.

use super::axis::{seconds, time_mesh, TimeAxis, TimeChart, LABELS_PX, MARGIN_PX};
use super::esc;
use crate::faults::{FaultPoint, FaultRecord};
use crate::report::{self, Report};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;

/// The charts' width in pixels; the page is laid out for it.
pub(super) const WIDTH: u32 = 1000;

/// The size of the charts' text (tick labels, legends, step labels) and of
/// their axis titles, in pixels on the page.
pub(super) const TEXT_PX: f64 = 13.0;
pub(super) const TITLE_PX: f64 = 14.0;

/// A chart font whose text is `px` pixels high on the page: plotters'
/// SVG backend writes a font's size divided by 1.24 (its default of 12
/// came out as 9.7 px, too small to read).
pub(super) fn font(px: f64) -> FontDesc<'static> {
    FontDesc::new(FontFamily::SansSerif, px * 1.24, FontStyle::Normal)
}

/// Draws one chart into an SVG string; a drawing error becomes a line of
/// text in the page (the rest of the report stands without the chart).
pub(super) fn chart<F>(draw: F, w: u32, h: u32) -> String
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
pub(super) fn fault_colour(point: &str) -> RGBColor {
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

/// The events chart, on the run's time axis: its plot and the rows of
/// fault codes above it.
pub(super) fn events_chart(r: &Report, axis: &TimeAxis) -> String {
    chart(|a| throughput(r, axis, a), WIDTH, 380 + CODES_PX)
}

/// Written, published and processed over time, with the faults.
fn throughput(
    r: &Report,
    axis: &TimeAxis,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let top = r
        .series
        .iter()
        .map(|s| s.written.max(s.published.unwrap_or(0)).max(s.applied.unwrap_or(0)))
        .max()
        .unwrap_or(0)
        .max(10);
    let y_top = top as f64 * 1.05;
    // The rows of codes sit between the margin and the plot.
    let mut c = axis.plot(area, MARGIN_PX + CODES_PX + 6, 0f64..y_top).map_err(e)?;
    time_mesh(&mut c).y_desc("count").y_label_formatter(&|v| format!("{v:.0}")).draw().map_err(e)?;
    fault_marks(&mut c, &r.fault_log, &r.fault_spans_ms, y_top).map_err(e)?;
    code_labels(area, &c, &r.fault_log, y_top).map_err(e)?;
    for (_, colour, value) in series(r) {
        // A figure a sample lacks (the broker did not answer) breaks its
        // line: drawn through, it would claim a count no one read.
        for run in r.series.split(|s| value(s).is_none()).filter(|run| !run.is_empty()) {
            let points = run.iter().filter_map(|s| value(s).map(|v| (seconds(s.at_ms), v as f64)));
            c.draw_series(LineSeries::new(points, colour.stroke_width(2))).map_err(e)?;
        }
    }
    Ok(())
}

/// A line of the events chart: its name, its colour and its count in a sample.
type Series<'a> = (&'a str, RGBColor, fn(&report::Sample) -> Option<u64>);

/// The events chart's lines, named in the kind of system's words for
/// what they count: where its components count nothing for the harness
/// (a declared system's programs, a program under test), the broker's
/// figures, the topic's messages and the group's committed offsets.
fn series(r: &Report) -> [Series<'_>; 3] {
    let [written, published, applied] = &r.shown.series;
    [
        (written.as_str(), RGBColor(31, 119, 180), |s| Some(s.written)),
        (published.as_str(), RGBColor(44, 160, 44), |s| s.published),
        (applied.as_str(), RGBColor(148, 103, 189), |s| s.applied),
    ]
}

/// Where the events chart's figures come from, in the page's words.
pub(super) fn sampled_from(r: &Report) -> &str {
    &r.shown.sampled_from
}

/// The events chart's legend, in HTML under it rather than drawn over its
/// lines: each line, then each kind of fault that fired.
pub(super) fn events_legend(r: &Report, out: &mut String) {
    let lines = series(r);
    let keys = lines.iter().map(|(name, colour, _)| (*name, *colour, false));
    let kinds = FAULT_KINDS
        .iter()
        .filter(|(kind, _)| r.fault_log.iter().any(|f| fault_kind(&f.point) == *kind))
        .map(|(kind, name)| (*name, fault_colour(if *kind == "infra" { "net" } else { kind }), true));
    legend(keys.chain(kinds), out);
}

/// A legend beside a chart: each key a swatch in its colour (a line, or a
/// band for a fault's marks) and its name.
fn legend<'a>(keys: impl Iterator<Item = (&'a str, RGBColor, bool)>, out: &mut String) {
    out.push_str("<p class=\"legend\">");
    for (name, RGBColor(red, green, blue), band) in keys {
        let _ = write!(
            out,
            "<span class=\"key\"><i{} style=\"background:#{red:02x}{green:02x}{blue:02x}\"></i>{}</span>",
            if band { " class=\"band\"" } else { "" },
            esc(name)
        );
    }
    out.push_str("</p>\n");
}

fn fault_kind(point: &str) -> &'static str {
    FaultPoint::from_name(point).and_then(|p| p.strike().component()).unwrap_or("infra")
}

/// Each logged fault as a vertical mark, or a band where its length is known.
fn fault_marks<DB: DrawingBackend>(
    c: &mut TimeChart<'_, DB>,
    log: &[FaultRecord],
    spans: &std::collections::BTreeMap<String, u64>,
    y_top: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let bands = log.iter().filter_map(|f| spans.get(&f.point).map(|len| (f, *len)));
    c.draw_series(bands.map(|(f, len)| {
        let (a, b) = (seconds(f.at_ms), seconds(f.at_ms + len));
        Rectangle::new([(a, 0.0), (b, y_top)], fault_colour(&f.point).mix(0.18).filled())
    }))?;
    // A band is named at its top as well as by its code above the chart.
    let bands = log.iter().filter_map(|f| spans.get(&f.point).map(|len| (f, *len)));
    c.draw_series(bands.map(|(f, _)| {
        let font = font(TEXT_PX).color(&fault_colour(&f.point));
        Text::new(format!(" {}", f.point), (seconds(f.at_ms), y_top * 0.98), font)
    }))?;
    let marks = log.iter().filter(|f| !spans.contains_key(&f.point));
    c.draw_series(marks.map(|f| {
        let x = seconds(f.at_ms);
        PathElement::new(vec![(x, 0.0), (x, y_top)], fault_colour(&f.point).mix(0.7).stroke_width(2))
    }))?;
    Ok(())
}

/// Rows of fault codes above the events chart, and their height in pixels.
const CODE_ROWS: usize = 6;
const CODE_ROW_PX: i32 = 16;
const CODES_PX: u32 = CODE_ROWS as u32 * CODE_ROW_PX as u32;

/// A short code per fault point that fired, in the order of their first
/// firing: A, B, … Z, then A2, B2, …; the page's legend names them.
pub(super) fn fault_codes(log: &[FaultRecord]) -> Vec<(&str, String)> {
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
pub(super) fn code_legend(r: &Report, out: &mut String) {
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
    c: &TimeChart<'_, DB>,
    log: &[FaultRecord],
    y_top: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let codes = fault_codes(log);
    let mut order: Vec<&FaultRecord> = log.iter().collect();
    order.sort_by_key(|f| f.at_ms);
    let mut row_end = [i32::MIN; CODE_ROWS];
    for f in order {
        let code = codes.iter().find(|(p, _)| *p == f.point).map_or("?", |(_, c)| c.as_str());
        let (x, top) = c.backend_coord(&(seconds(f.at_ms), y_top));
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
pub(super) fn instances(r: &Report) -> Vec<String> {
    let mut names = r.shown.instances.clone();
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

/// The instances' lanes, `lanes` top to bottom, on the run's time axis:
/// a lane each between the margins and the time labels.
pub(super) fn lanes_chart(r: &Report, axis: &TimeAxis, lanes: &[String]) -> String {
    let h = 2 * MARGIN_PX + LABELS_PX + LANE_PX * lanes.len() as u32;
    chart(|a| instance_lanes(r, axis, lanes, a), WIDTH, h)
}

/// A lane per component instance, top to bottom, with its firings: a
/// mark at each (a band where the scenario gives its length), its code
/// above it when that does not cover the code before.
fn instance_lanes(
    r: &Report,
    axis: &TimeAxis,
    lanes: &[String],
    area: &DrawingArea<SVGBackend<'_>, Shift>,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let n = lanes.len() as f64;
    let mut c = axis.plot(area, MARGIN_PX, 0f64..n).map_err(e)?;
    time_mesh(&mut c).disable_y_mesh().disable_y_axis().draw().map_err(e)?;
    // Lane i spans [n-1-i, n-i] on the y axis; every other one is shaded.
    let bottom = |i: usize| n - 1.0 - i as f64;
    c.draw_series(
        (0..lanes.len())
            .filter(|i| i % 2 == 0)
            .map(|i| Rectangle::new([(0.0, bottom(i)), (axis.end_s, bottom(i) + 1.0)], BLACK.mix(0.05).filled())),
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
        let (a, y) = (seconds(f.at_ms), bottom(i));
        let colour = fault_colour(&f.point);
        match r.fault_spans_ms.get(&f.point) {
            Some(len) => c.draw_series(std::iter::once(Rectangle::new(
                [(a, y + 0.1), (a + seconds(*len), y + 0.5)],
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

/// The latency chart: its buckets, or its percentiles.
pub(super) fn latency_chart(l: &report::Latency) -> String {
    chart(|a| latency(l, a), WIDTH, 300)
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
    for (_, v, colour) in marks(l) {
        let x = v.max(lo);
        c.draw_series(std::iter::once(PathElement::new(vec![(x, 0.0), (x, top)], colour.stroke_width(2))))
            .map_err(e)?;
    }
    Ok(())
}

/// The percentiles the latency chart marks: each one's name, value and colour.
fn marks(l: &report::Latency) -> [(&'static str, f64, RGBColor); 3] {
    [
        ("p50", l.p50, RGBColor(44, 160, 44)),
        ("p99", l.p99, RGBColor(230, 120, 0)),
        ("max", l.max, RGBColor(200, 30, 30)),
    ]
}

/// The latency chart's legend, in HTML under it rather than over its bars:
/// the percentiles it marks (a report from before the buckets has bars, no marks).
pub(super) fn latency_legend(l: &report::Latency, out: &mut String) {
    if l.buckets.is_empty() {
        return;
    }
    let names: Vec<(String, RGBColor)> =
        marks(l).iter().map(|(name, v, colour)| (format!("{name} {v:.0} ms"), *colour)).collect();
    legend(names.iter().map(|(name, colour)| (name.as_str(), *colour, false)), out);
}
