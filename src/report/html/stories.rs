//! Each anomaly example's story: its payment's dated steps on one line of
//! time, a lane per kind of step, with the run's faults in its window;
//! then its steps as a table and its messages on the topic. A story's
//! chart spans its own window of time, not the run's, in the same seconds.

use super::axis::{seconds, time_mesh};
use super::charts::{chart, fault_colour, font, TEXT_PX, WIDTH};
use super::{esc, table};
use crate::faults::FaultRecord;
use crate::report::Report;
use crate::verifier::story::Story;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;

/// One example's story: a chart of its dated steps by lane, its steps as a
/// table, and its messages on the topic.
pub(super) fn story(r: &Report, s: &Story, i: usize, out: &mut String) {
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
            row.insert(0, format!("{:.3}", seconds(at)));
            row
        })
        .collect();
    table(out, &["s into the run", "where", "what", "event or message"], &rows);
    out.push_str("</section>\n");
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
    let (x0, x1) = (seconds(first), seconds(last));
    let h = layout.height() as f64;
    let mut c = ChartBuilder::on(area)
        .margin(STORY_MARGIN)
        .x_label_area_size(STORY_AXIS)
        .y_label_area_size(STORY_LEFT)
        .build_cartesian_2d(x0..x1, 0f64..h)
        .map_err(e)?;
    time_mesh(&mut c).disable_y_mesh().disable_y_axis().draw().map_err(e)?;
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
        let (a, len) = (seconds(f.at_ms), seconds(spans.get(&f.point).copied().unwrap_or(0)));
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
