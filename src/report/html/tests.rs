use super::charts::{fault_codes, instances};
use super::*;

#[test]
fn a_report_from_before_the_charts_still_draws() {
    // The sample report as a report from before the series, the latency
    // buckets and the stories: the page draws its percentiles and its
    // tables.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/sample-payments-postgres-kafka.json");
    let mut old: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let fields = old.as_object_mut().unwrap();
    fields.remove("series");
    fields.remove("stories");
    if let Some(latency) = fields.get_mut("latency_ms").and_then(|l| l.as_object_mut()) {
        latency.remove("buckets");
    }
    let mut r: Report = serde_json::from_value(old).unwrap();
    r.shown = crate::report::shown::Shown::payments(&r);
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
    r.shown = crate::report::shown::Shown::payments(&r);
    r.series = (0..40)
        .map(|i| report::Sample { at_ms: i * 250, written: i * 25, published: Some(i * 24), applied: Some(i * 23) })
        .collect();
    if let Some(l) = &mut r.latency_ms {
        l.buckets = (0..12).map(|i| report::LatencyBucket { up_to_ms: 1 << i, events: 10 * i }).collect();
    }
    for (i, f) in r.fault_log.iter_mut().enumerate() {
        if i % 3 == 0 {
            f.reach.seqs = vec![(3, 4), (10, 10)];
        } else {
            // A consumer's firing: its reach is topic offsets alone.
            f.reach.seqs = vec![];
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

/// Issue 64: a declared system's lines are the broker's figures, named
/// for what they count, and a sample the broker did not answer for is a
/// gap in its line, not a drop to 0.
#[test]
fn a_declared_systems_chart_names_the_brokers_figures_and_breaks_at_a_gap() {
    let mut r = busy();
    r.shown = crate::report::shown::Shown::declared(&r, &Default::default());
    r.series[10].published = None;
    r.series[10].applied = None;
    let page = render(&r);
    assert!(!page.contains("the chart could not be drawn"), "a gap still draws");
    let legend = section_of(&page, "throughput");
    for name in ["operations acknowledged", "messages on the topic", "offsets committed"] {
        assert!(legend.contains(name), "{name} not in the legend");
    }
    assert!(legend.contains("from the broker"), "the page says where the figures come from");
    // Each broker line is drawn as two pieces either side of the gap.
    let chart = &page[page.find("<svg").unwrap()..];
    let pieces = |colour: &str| chart[..chart.find("</svg>").unwrap()].matches(&format!("stroke=\"{colour}\"")).count();
    assert!(pieces("#1F77B4") > 0, "the written line is drawn");
    assert_eq!(pieces("#2CA02C"), 2 * pieces("#1F77B4"), "published: two pieces where written has one");
}

#[test]
fn the_run_wide_charts_share_one_time_axis() {
    // The events chart and the instances' lanes are built on the page's one
    // axis: whatever their heights and y spans, a firing is at the same x.
    let r = busy();
    let axis = TimeAxis::of(&r);
    let last = r.fault_log.iter().map(|f| f.at_ms).max().unwrap().max(r.series.last().unwrap().at_ms);
    assert_eq!(axis.end_s, seconds(last.max(1000)));
    let xs = |top_px: u32, h: u32, y: std::ops::Range<f64>| {
        use plotters::prelude::*;
        let mut svg = String::new();
        let area = SVGBackend::with_string(&mut svg, (charts::WIDTH, h)).into_drawing_area();
        let c = axis.plot(&area, top_px, y).unwrap();
        r.fault_log.iter().map(|f| c.backend_coord(&(seconds(f.at_ms), 0.0)).0).collect::<Vec<i32>>()
    };
    let (events, lanes) = (xs(114, 476, 0.0..1050.0), xs(12, 400, 0.0..7.0));
    assert_eq!(events, lanes);
    assert!(events.windows(2).any(|w| w[0] != w[1]), "the firings are spread in time: {events:?}");
    let empty = TimeAxis::of(&Report { series: vec![], fault_log: vec![], ..r });
    assert_eq!(empty.end_s, 1.0, "at least one second");
}

/// Every `<text>` of the page's charts: its font size and its words.
fn chart_texts(page: &str) -> Vec<(f64, String)> {
    page.split("<text")
        .skip(1)
        .map(|t| {
            let size = t.split("font-size=\"").nth(1).and_then(|v| v.split('"').next()).and_then(|v| v.parse().ok());
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
    assert_eq!(tile(&page, "messages"), "2156");
    assert_eq!(tile(&page, "faults"), "34");
    assert_eq!(tile(&page, "invariants"), "36/36");
    assert_eq!(tile(&page, "latency"), "1221 ms");
    r.invariants[3].ok = false;
    r.verdict = Verdict::Fail;
    r.latency_ms = None;
    let page = render(&r);
    assert_eq!(tile(&page, "verdict"), "FAIL");
    assert_eq!(tile(&page, "invariants"), "35/36");
    assert!(page.contains("class=\"tile bad\" id=\"tile-invariants\""));
    assert_eq!(tile(&page, "latency"), "–");
    r.verdict = Verdict::Incomplete;
    assert_eq!(tile(&render(&r), "invariants"), "–/36", "an unjudged run holds and breaks nothing");
}

#[test]
fn a_failing_page_opens_with_the_summarys_harm() {
    use crate::verifier::Anomaly;
    let mut r = busy();
    assert!(!render(&r).contains("id=\"harm\""), "a passing page has no harm");
    r.verdict = Verdict::Fail;
    r.counts.payments_with_many_receipts = 61;
    let anomaly = |name: &str, count| Anomaly {
        name: name.into(),
        count,
        examples: vec![format!("{name} <example>")],
        allowed: false,
        subjects: vec![],
        followed: vec![],
        found_by: vec![],
    };
    r.anomalies = vec![anomaly("duplicate effect", 122), anomaly("counter drift", 46)];
    let page = render(&r);
    // Right under the title, before the reason and the tiles; the terminal's lines, escaped.
    let body = &page[page.find("</h1>\n").unwrap() + 6..];
    assert!(body.starts_with("<section id=\"harm\" class=\"harm\"><dl><dt>harm</dt>"), "{body}");
    let harm = &body[..body.find("</section>").unwrap()];
    assert_eq!(
        harm,
        "<section id=\"harm\" class=\"harm\"><dl><dt>harm</dt><dd class=\"first\">61 payments got 2 or more \
         receipts</dd><dd>122 × duplicate effect · 46 × counter drift</dd><dt>example</dt><dd>duplicate effect \
         &lt;example&gt;</dd></dl>"
    );
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
    assert!(rows[0].contains("<td>0.139</td><td>relay.after_produce</td><td>relay-2</td>"), "{}", rows[0]);
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
        found_by: vec![],
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
