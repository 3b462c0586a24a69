//! The HTML report, checked in a real browser. A passing run and a failing
//! one (the inbox off, relays crashing after their produce) each write
//! `reports/<run-id>.html`; the page loads nothing from the network;
//! headless Chromium (Debian's `chromium`, which scripts/test.sh installs)
//! renders it: its DOM holds the charts' SVG and, for the failing run, each
//! anomaly example's story with its messages' `partition:offset`, and its
//! screenshot (scripts/screenshot.sh) is a real picture, not one flat
//! colour. `chaos report <file.json> --html` draws the same page again from
//! the JSON alone. Each body runs on the real services and embedded. Both
//! pages open with tiles of the report's figures, list every logged firing
//! in a fault log, give each fault mark its code and each component
//! instance its lane, and draw no chart text under 12 px; a story's labels
//! never cover each other. The verdict is read first: its badge and tile
//! are readable (the browser's computed colours give a contrast ratio of at
//! least 4.5, WCAG's level for text) and not clipped, and a failing page
//! opens with the terminal's `harm` line. The charts' legends sit beside
//! them, not on their data. `CHAOS_UPDATE_SCREENSHOT=1` makes the failing
//! run on the services take docs/report-failing.png again.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The browser, or a failure that says how to get it: a test that cannot
/// look at the page must not pass.
fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("chromium is not installed: run the tests with scripts/test.sh, which installs Debian's chromium package");
}

/// Runs `cmd` to its end, killed after `limit`; returns its stdout.
fn bounded(cmd: &mut Command, limit: Duration) -> String {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("cannot start the command");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// The page as headless Chromium builds it (its DOM after parsing).
fn rendered_dom(page: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let mut c = Command::new(chromium());
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url);
    let dom = bounded(&mut c, Duration::from_secs(60));
    assert!(dom.contains("</html>"), "chromium gave no DOM for {}:\n{dom}", page.display());
    dom
}

/// Takes a screenshot with scripts/screenshot.sh and checks it is a real
/// picture: the window's size, mostly not blank, many colours.
fn screenshot_is_a_picture(page: &Path, dir: &Path) {
    let png = dir.join("shot.png");
    let mut c = Command::new("bash");
    c.arg(root().join("scripts/screenshot.sh")).arg(page).arg(&png).arg("1000x1600");
    let printed = bounded(&mut c, Duration::from_secs(90));
    assert!(printed.trim().ends_with("shot.png"), "screenshot.sh printed {printed:?}");
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a PNG's size")];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    assert_eq!((info.width, info.height), (1000, 1600), "the window's size");
    let px = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    let colours: std::collections::HashSet<&[u8]> = pixels.iter().copied().collect();
    let inked = pixels.iter().filter(|p| p.iter().take(3).any(|c| *c < 200)).count();
    assert!(colours.len() > 50, "the screenshot has {} colours: a blank or flat page", colours.len());
    assert!(inked * 100 > pixels.len(), "under 1% of the screenshot is drawn on ({inked} of {} pixels)", pixels.len());
}

/// Nothing on the page comes from elsewhere: no scripts, no remote
/// sources, links, imports or fonts.
fn loads_nothing(html: &str) {
    for bad in ["src=\"http", "href=\"http", "src='http", "href='http", "url(http", "@import", "<script", "<link"] {
        assert!(!html.contains(bad), "the page loads something from elsewhere: {bad}");
    }
}

/// WCAG 2's level for text: the verdict must reach it against its background.
const READABLE: f64 = 4.5;

/// A script the test adds to a copy of the page (the page itself runs
/// none): for the verdict's badge and tile it writes what the browser
/// computed, as JSON in `<pre id="probe">`, which `--dump-dom` then
/// prints. The text's colour and everything behind it (each background up
/// to the page's white, with its alpha, and the opacities) are flattened
/// to the colours a reader sees; `clipped` is text running out of its box.
const PROBE: &str = r#"<script>
const rgba = s => { const n = s.match(/[\d.]+/g).map(Number); return [n[0], n[1], n[2], n.length > 3 ? n[3] : 1]; };
const over = (top, under, a) => [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a));
const seen = el => {
  const layers = [];
  let opacity = 1;
  for (let e = el; e; e = e.parentElement) {
    const cs = getComputedStyle(e);
    opacity *= Number(cs.opacity);
    layers.push(rgba(cs.backgroundColor));
  }
  const bg = layers.reverse().reduce((under, c) => over(c, under, c[3]), [255, 255, 255]);
  const fg = rgba(getComputedStyle(el).color);
  const range = document.createRange();
  range.selectNodeContents(el);
  const text = range.getBoundingClientRect(), frame = (el.closest('.tile') || el).getBoundingClientRect();
  const clipped = text.width === 0 || text.left < frame.left - 0.5 || text.right > frame.right + 0.5;
  return { text: el.textContent.trim(), fg: over(fg, bg, fg[3] * opacity), bg, clipped };
};
const probe = document.createElement('pre');
probe.id = 'probe';
probe.textContent = JSON.stringify({ badge: seen(document.querySelector('h1 .verdict')),
  tile: seen(document.querySelector('#tile-verdict .value')) });
document.body.append(probe);
</script>"#;

/// WCAG 2's contrast ratio of two sRGB colours (0–255), from 1 to 21.
fn contrast(a: [f64; 3], b: [f64; 3]) -> f64 {
    let luminance = |c: [f64; 3]| {
        let lin = |v: f64| {
            let s = v / 255.0;
            if s <= 0.03928 {
                s / 12.92
            } else {
                ((s + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2])
    };
    let (x, y) = (luminance(a), luminance(b));
    (x.max(y) + 0.05) / (x.min(y) + 0.05)
}

/// The verdict as Chromium draws `page` in a 1000 px wide window: the
/// badge beside the title and the first tile each read `verdict` (upper
/// case), in a colour at least [`READABLE`] against what is behind it,
/// not clipped. Each one's contrast is printed (`--nocapture` shows it).
fn the_verdict_is_readable(page: &Path, verdict: &str) {
    let html = std::fs::read_to_string(page).unwrap();
    let probed = page.with_file_name("probe.html");
    std::fs::write(&probed, html.replace("</body>", &format!("{PROBE}</body>"))).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let mut c = Command::new(chromium());
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,1600", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", probed.canonicalize().unwrap().display()));
    let dom = bounded(&mut c, Duration::from_secs(60));
    let json = dom.split("<pre id=\"probe\">").nth(1).and_then(|p| p.split("</pre>").next());
    let json = json.unwrap_or_else(|| panic!("the probe wrote nothing into {}:\n{dom}", probed.display()));
    let json = json.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&");
    let seen: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rgb = |v: &serde_json::Value| -> [f64; 3] {
        let c: Vec<f64> = v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        [c[0], c[1], c[2]]
    };
    // Both are measured before either is judged, so a failure shows both.
    let mut wrong = Vec::new();
    for what in ["badge", "tile"] {
        let s = &seen[what];
        let (fg, bg) = (rgb(&s["fg"]), rgb(&s["bg"]));
        let ratio = contrast(fg, bg);
        eprintln!("the verdict's {what} on the {verdict} page: text {fg:?} on {bg:?}, contrast {ratio:.2}");
        if s["text"] != verdict.to_uppercase().as_str() {
            wrong.push(format!("its {what} says {} instead of the verdict", s["text"]));
        }
        if ratio < READABLE {
            wrong.push(format!(
                "its {what} is unreadable: text {fg:?} on {bg:?}, contrast {ratio:.2} (at least {READABLE} needed)"
            ));
        }
        if s["clipped"] != false {
            wrong.push(format!("its {what}'s text is clipped: {s}"));
        }
    }
    assert!(wrong.is_empty(), "the verdict of the {verdict} page:\n{}", wrong.join("\n"));
}

/// Each chart's legend sits beside it, in the page, not over its data:
/// the events chart's names its three lines, the latency chart's its
/// percentiles, and neither chart draws a legend of its own.
fn legends_sit_beside_the_charts(dom: &str) {
    for (id, names) in [
        ("throughput", &["payments written", "messages published", "events processed"][..]),
        ("latency", &["p50", "p99", "max"][..]),
    ] {
        let s = section(dom, id);
        let Some(svg_at) = s.find("<svg") else { continue };
        let legend =
            s.find("class=\"legend\"").map(|at| &s[at..]).unwrap_or_else(|| panic!("no legend beside the {id} chart"));
        let legend = &legend[..legend.find("</p>").unwrap()];
        let svg = &s[svg_at..s.find("</svg>").unwrap()];
        let drawn: Vec<String> = text_boxes(svg).into_iter().map(|(_, w)| w).collect();
        for name in names {
            assert!(legend.contains(name), "the {id} chart's legend names {name}: {legend}");
            assert!(!drawn.iter().any(|w| w.starts_with(name)), "the {id} chart draws {name} over its data: {drawn:?}");
        }
    }
}

/// A failing page opens with the harm, as the terminal's summary does:
/// right under the title, before the tiles, the summary's `harm` line.
fn the_harm_leads_the_page(json: &Path, dom: &str) {
    let summary = run(chaos().arg("report").arg(json).arg("--summary").env("COLUMNS", "1000"));
    let harm = summary.stdout.lines().find_map(|l| l.trim_start().strip_prefix("harm")).map(str::trim);
    let harm = harm.unwrap_or_else(|| panic!("no harm line in the summary:\n{}", summary.stdout));
    let at = dom.find("id=\"harm\"").unwrap_or_else(|| panic!("no harm on the page"));
    let opened = dom[..at].rfind('<').unwrap();
    let title_end = dom.find("</h1>").unwrap() + "</h1>".len();
    assert!(
        title_end <= opened && dom[title_end..opened].trim().is_empty(),
        "the harm comes right after the title, first of all: {:?} comes between",
        &dom[title_end.min(opened)..opened]
    );
    let lead = &dom[at..];
    let lead = &lead[..lead.find("</section>").unwrap()];
    let words = |s: &str| {
        let text: String = s.split('<').map(|t| t.split_once('>').map_or(t, |(_, w)| w)).collect();
        text.replace("&amp;", "&").split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert!(words(lead).contains(harm), "the page's harm {:?} is the summary's {harm:?}", words(lead));
}

/// The run's page, checked; returns the report and the page's path.
fn run_and_check(backend: Backend, scenario: &str, dir: &Path) -> (serde_json::Value, PathBuf, String) {
    // Relative to the checkout (where `chaos()` runs), as a user types it:
    // the page, and the README's picture of it, show no path of this machine.
    let ran = run_scenario(backend, Path::new(scenario), dir, &[]);
    let r = ran.json();
    let id = r["run_id"].as_str().unwrap().to_string();
    let page = dir.join(format!("{id}.html"));
    let html = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("no {}: {e}", page.display()));
    loads_nothing(&html);
    assert!(!html.contains(&root().display().to_string()), "the page shows the checkout's path");
    assert!(r["series"].as_array().is_some_and(|s| s.len() >= 4), "the run sampled its counters: {}", r["series"]);
    let dom = rendered_dom(&page);
    the_verdict_is_readable(&page, r["verdict"].as_str().unwrap());
    legends_sit_beside_the_charts(&dom);
    // The events chart: plotters draws each counter as a polyline through
    // its samples, in its own colour (fault marks have 2 points).
    let chart = section(&dom, "throughput");
    assert!(chart.contains("<svg"), "no chart in the events section:\n{chart}");
    let lines = polylines(chart);
    for colour in ["#1F77B4", "#2CA02C", "#9467BD"] {
        assert!(
            lines.iter().any(|(c, n)| c.eq_ignore_ascii_case(colour) && *n >= 4),
            "no line of samples in {colour} among {lines:?}"
        );
    }
    for table in ["verification", "faults", "invariants"] {
        assert!(section(&dom, table).contains("<table"), "no {table} table");
    }
    tiles_tell_the_run(&r, &dom);
    fault_log_lists_the_firings(&r, &dom);
    each_instance_has_a_lane(&r, &dom);
    each_fault_mark_has_its_code(&r, &dom);
    // Every text of every chart readable: at least 12 px.
    let texts = text_boxes(&dom);
    assert!(texts.len() > 20, "the charts have text: {texts:?}");
    for (b, words) in &texts {
        assert!(b[3] - b[1] >= 12.0, "chart text {words:?} is {} px high", b[3] - b[1]);
    }
    // `chaos report --html` draws the same page from the JSON alone.
    let again = dir.join("again.html");
    let json = dir.join(format!("{id}.json"));
    let redrawn = run(chaos().arg("report").arg(&json).arg("--html").arg("--out").arg(&again));
    assert_eq!(redrawn.code, ran.code, "{}", redrawn.stderr);
    assert_eq!(redrawn.stdout.trim(), again.display().to_string());
    assert!(std::fs::read_to_string(&again).unwrap() == html, "the page drawn again from the JSON differs");
    eprintln!("{scenario} on {backend:?}: run {:.1}s, verdict {}", ran.elapsed.as_secs_f64(), r["verdict"]);
    (r, page, dom)
}

/// The value a summary tile shows.
fn tile<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom.find(&format!("id=\"tile-{id}\"")).unwrap_or_else(|| panic!("no tile {id}"));
    let value = &dom[at..][dom[at..].find("class=\"value\">").unwrap() + "class=\"value\">".len()..];
    &value[..value.find('<').unwrap()]
}

/// The tiles at the top of the page show the report's figures.
fn tiles_tell_the_run(r: &serde_json::Value, dom: &str) {
    let summary = section(dom, "summary");
    assert!(dom.find("id=\"summary\"").unwrap() < dom.find("id=\"throughput\"").unwrap(), "the tiles come first");
    assert_eq!(summary.matches("id=\"tile-").count(), 7, "seven tiles: {summary}");
    let c = &r["counts"];
    assert_eq!(tile(dom, "verdict"), r["verdict"].as_str().unwrap().to_uppercase());
    assert_eq!(tile(dom, "driven"), c["payments"].to_string());
    assert_eq!(tile(dom, "effects"), c["receipts"].to_string());
    assert_eq!(tile(dom, "messages"), c["topic_messages"].to_string());
    let fired: u64 = r["faults"].as_array().unwrap().iter().map(|f| f["fired"].as_u64().unwrap()).sum();
    assert!(fired > 0, "the run's faults fired");
    assert_eq!(tile(dom, "faults"), fired.to_string());
    let checks: Vec<&serde_json::Value> =
        r["invariants"].as_array().unwrap().iter().chain(r["chaos_checks"].as_array().unwrap()).collect();
    let held = checks.iter().filter(|i| i["ok"] == true).count();
    assert_eq!(tile(dom, "invariants"), format!("{held}/{}", checks.len()));
    let p99 = r["latency_ms"]["p99"].as_f64();
    assert_eq!(tile(dom, "latency"), p99.map_or("–".to_string(), |p| format!("{p:.0} ms")));
}

/// The fault log's table has a row per logged firing (up to its cap of
/// 200), each naming its point and component, with the reach of those
/// that have one.
fn fault_log_lists_the_firings(r: &serde_json::Value, dom: &str) {
    let log = r["fault_log"].as_array().unwrap();
    assert!(!log.is_empty(), "the run logged its firings");
    let table = section(dom, "fault-log");
    let body = &table[table.find("<tbody>").expect("a fault log table")..];
    let rows: Vec<&str> = body.split("<tr>").skip(1).collect();
    assert_eq!(rows.len(), log.len().min(200), "a row per logged firing");
    for (row, f) in rows.iter().zip(log) {
        let at = format!("<td>{:.3}</td>", f["at_ms"].as_u64().unwrap() as f64 / 1000.0);
        for cell in [
            at,
            format!("<td>{}</td>", f["point"].as_str().unwrap()),
            format!("<td>{}</td>", f["component"].as_str().unwrap()),
        ] {
            assert!(row.contains(&cell), "{cell} not in {row}");
        }
        if let Some(seqs) = f["reach"]["seqs"].as_array() {
            let (a, b) = (seqs[0][0].as_i64().unwrap(), seqs[0][1].as_i64().unwrap());
            let first = if a == b { a.to_string() } else { format!("{a}–{b}") };
            assert!(row.contains(&format!("outbox seqs {first}")), "the reach {seqs:?} in {row}");
        }
    }
    assert!(log.iter().any(|f| f["reach"]["seqs"].is_array()), "a relay's firing reaches its batch's seqs");
}

/// The lanes chart has one lane per relay and notifier the scenario
/// starts and per component a fault fired in, labelled with its firings.
fn each_instance_has_a_lane(r: &serde_json::Value, dom: &str) {
    let lanes = section(dom, "instances");
    let texts: Vec<String> = text_boxes(lanes).into_iter().map(|(_, w)| w).collect();
    let log = r["fault_log"].as_array().unwrap();
    let mut names: Vec<String> = log.iter().map(|f| f["component"].as_str().unwrap().to_string()).collect();
    names.extend((1..=r["scenario"]["relays"].as_u64().unwrap()).map(|i| format!("relay-{i}")));
    names.extend((1..=r["scenario"]["notifiers"].as_u64().unwrap()).map(|i| format!("notifier-{i}")));
    names.sort();
    names.dedup();
    for name in &names {
        let n = log.iter().filter(|f| f["component"] == name.as_str()).count();
        let lane = format!("{name} ({n})");
        assert_eq!(texts.iter().filter(|t| **t == lane).count(), 1, "one lane {lane:?} among {texts:?}");
    }
    let lane_names = texts.iter().filter(|t| t.ends_with(')') && t.contains(" (")).count();
    assert_eq!(lane_names, names.len(), "no other lane: {texts:?}");
}

/// Each fault mark on the events chart has its point's code above it,
/// and the legend under the chart names every code.
fn each_fault_mark_has_its_code(r: &serde_json::Value, dom: &str) {
    let chart = section(dom, "throughput");
    let legend = &chart[chart.find("class=\"codes\"").expect("a legend of the fault codes")..];
    let codes: Vec<(&str, &str)> = legend
        .split("<b>")
        .skip(1)
        .map(|c| {
            let code = &c[..c.find("</b>").unwrap()];
            let point = c[c.find("</b>").unwrap() + 4..].trim_start().split(' ').next().unwrap();
            (code, point)
        })
        .collect();
    let log = r["fault_log"].as_array().unwrap();
    let mut points: Vec<&str> = log.iter().map(|f| f["point"].as_str().unwrap()).collect();
    points.sort();
    points.dedup();
    let mut named: Vec<&str> = codes.iter().map(|(_, p)| *p).collect();
    named.sort();
    assert_eq!(named, points, "the legend names each point that fired");
    let labels = text_boxes(&chart[..chart.find("</svg>").unwrap()])
        .into_iter()
        .filter(|(_, w)| codes.iter().any(|(c, _)| c == w))
        .count();
    assert_eq!(labels, log.len(), "a code per logged firing on the chart");
}

/// Each unrotated `<text>` of the SVG in `dom` as the box it covers
/// (left, top, right, bottom; a letter about 0.6 of its size wide),
/// with its words.
fn text_boxes(dom: &str) -> Vec<([f64; 4], String)> {
    dom.split("<text")
        .skip(1)
        .filter_map(|t| {
            let tag = &t[..t.find('>')?];
            let attr = |name: &str| tag.split(&format!(" {name}=\"")).nth(1).and_then(|v| v.split('"').next());
            if attr("transform").is_some() {
                return None;
            }
            let num = |name: &str| attr(name).and_then(|v| v.parse::<f64>().ok());
            let (x, y, size) = (num("x")?, num("y")?, num("font-size").unwrap_or(0.0));
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

/// The first two texts whose boxes overlap, if any.
fn overlapping(boxes: &[([f64; 4], String)]) -> Option<(String, String)> {
    for (i, (a, aw)) in boxes.iter().enumerate() {
        for (b, bw) in &boxes[i + 1..] {
            if a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3] {
                return Some((aw.clone(), bw.clone()));
            }
        }
    }
    None
}

/// Each `<polyline>` of an SVG: its stroke colour and how many points it has.
fn polylines(svg: &str) -> Vec<(String, usize)> {
    svg.split("<polyline")
        .skip(1)
        .map(|p| {
            let p = &p[..p.find('>').unwrap_or(p.len())];
            let attr = |name: &str| {
                let at = p.find(&format!("{name}=\"")).map(|i| i + name.len() + 2);
                at.map(|i| p[i..i + p[i..].find('"').unwrap_or(0)].to_string()).unwrap_or_default()
            };
            (attr("stroke"), attr("points").split_whitespace().count())
        })
        .collect()
}

/// The DOM of `<section id="{id}">`, up to its end.
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom.find(&format!("<section id=\"{id}\"")).unwrap_or_else(|| panic!("no section {id}"));
    let rest = &dom[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

fn a_passing_run_draws_its_page(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (r, page, dom) = run_and_check(backend, "tests/fixtures/html/clean.toml", dir.path());
    assert_eq!(r["verdict"], "pass", "{}", r["reason"]);
    assert!(section(&dom, "latency").contains("<svg"), "no latency chart");
    assert!(r["latency_ms"]["buckets"].as_array().is_some_and(|b| !b.is_empty()), "no latency buckets");
    assert!(!dom.contains("class=\"story\""), "a passing run has no stories");
    screenshot_is_a_picture(&page, dir.path());
    // The verdicts neither passing nor failing share a colour: the page
    // drawn again as the longest of them, INCONCLUSIVE, reads as well.
    if backend == Backend::Embedded {
        let mut other = r.clone();
        other["verdict"] = "inconclusive".into();
        let json = dir.path().join("inconclusive.json");
        std::fs::write(&json, other.to_string()).unwrap();
        let again = dir.path().join("inconclusive.html");
        let redrawn = run(chaos().arg("report").arg(&json).arg("--html").arg("--out").arg(&again));
        assert_eq!(redrawn.stdout.trim(), again.display().to_string(), "{}", redrawn.stderr);
        the_verdict_is_readable(&again, "inconclusive");
    }
}

fn a_failing_run_tells_each_examples_story(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (r, page, dom) = run_and_check(backend, "tests/fixtures/html/broken.toml", dir.path());
    assert_eq!(r["verdict"], "fail", "{}", r["reason"]);
    the_harm_leads_the_page(&dir.path().join(format!("{}.json", r["run_id"].as_str().unwrap())), &dom);
    let stories = r["stories"].as_array().expect("stories in the report");
    assert!(!stories.is_empty(), "no story for the anomalies: {}", r["anomalies"]);
    let dup = stories.iter().find(|s| s["anomaly"] == "duplicate effect").expect("a duplicate effect's story");
    let steps: Vec<&str> = dup["steps"].as_array().unwrap().iter().map(|s| s["what"].as_str().unwrap()).collect();
    // As many receipts on its line as its example counts ("payment …: 2 receipts; …").
    let anomaly = r["anomalies"].as_array().unwrap().iter().find(|a| a["name"] == "duplicate effect").unwrap();
    let example = anomaly["examples"][dup["example"].as_u64().unwrap() as usize].as_str().unwrap();
    let receipts: usize = example
        .split_once(": ")
        .and_then(|(_, rest)| rest.split_once(" receipts"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no receipt count in {example:?}"));
    assert!(receipts >= 2, "{example}");
    let sent = steps.iter().filter(|s| **s == "receipt sent").count();
    assert_eq!(sent, receipts, "the story's receipts against its example {example:?}: {steps:?}");
    // Each outbox row with the seq a relay's fault log names.
    assert!(steps.iter().any(|s| s.contains("row published (seq ")), "its outbox rows: {steps:?}");
    assert!(!dup["seqs"].as_array().expect("the story's seqs").is_empty(), "{dup}");
    deliveries_cover_receipts(dup, receipts);
    // Its authorized and captured events at least; a copy from a relay's
    // crash adds one, a redelivery by the group (the mock cluster's slow
    // rebalances) does not.
    assert!(dup["messages"].as_array().unwrap().len() >= 2, "its messages: {dup}");
    // In the browser: a section per story, each with its line of time and
    // its messages as partition:offset.
    let rendered = dom.matches("<section class=\"story\"").count();
    assert_eq!(rendered, stories.len(), "one story section per story");
    let pid = dup["payment"].as_str().unwrap();
    let start = dom.find(&format!("data-payment=\"{pid}\"")).unwrap();
    let story = &dom[start..start + dom[start..].find("</section>").unwrap()];
    assert!(story.contains("<svg"), "the story has no line of time");
    assert!(story.contains("receipt sent"), "the line of time names its steps");
    for m in dup["messages"].as_array().unwrap() {
        let at = format!("{}:{} {}", m["partition"], m["offset"], m["kind"].as_str().unwrap());
        assert!(story.contains(&at), "the story lists its message {at}");
    }
    // No two labels of a story's line of time over each other.
    for s in dom.split("<section class=\"story\"").skip(1) {
        let Some(end) = s.find("</svg>") else { continue };
        let boxes = text_boxes(&s[..end]);
        assert!(boxes.iter().any(|(_, w)| w == "receipt sent" || w.contains("row")), "step labels: {boxes:?}");
        assert_eq!(overlapping(&boxes), None, "two labels of a story drawn over each other");
    }
    screenshot_is_a_picture(&page, dir.path());
    // The picture of a failing page in the docs, taken again only when asked.
    if backend == Backend::Services && std::env::var("CHAOS_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        // No path of this machine on the picture: not the checkout's (checked
        // on every page), nor the reports' folder.
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(!html.contains(&dir.path().display().to_string()), "the page shows the reports' folder");
        let png = dir.path().join("docs.png");
        let mut c = Command::new("bash");
        c.arg(root().join("scripts/screenshot.sh")).arg(&page).arg(&png).arg("1000x1400");
        bounded(&mut c, Duration::from_secs(90));
        std::fs::copy(&png, root().join("docs/report-failing.png")).expect("cannot write docs/report-failing.png");
    }
}

/// Without an inbox every receipt comes from a delivery of its captured
/// event: at least as many deliveries of it are on the story's line.
fn deliveries_cover_receipts(story: &serde_json::Value, receipts: usize) {
    let steps = story["steps"].as_array().unwrap();
    let deliveries = steps
        .iter()
        .filter(|s| s["lane"] == "delivery" && s["what"].as_str().unwrap().starts_with("captured "))
        .count();
    assert!(deliveries >= receipts, "{receipts} receipts, {deliveries} deliveries of the captured event: {story}");
}

/// The number in an example such as "payment …: 2 receipts; topic: …".
fn receipts_of(r: &serde_json::Value, story: &serde_json::Value) -> usize {
    let anomaly = r["anomalies"].as_array().unwrap().iter().find(|a| a["name"] == story["anomaly"]).unwrap();
    let example = anomaly["examples"][story["example"].as_u64().unwrap() as usize].as_str().unwrap();
    example
        .split_once(": ")
        .and_then(|(_, rest)| rest.split_once(" receipts"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no receipt count in {example:?}"))
}

/// Notifiers that run as OS processes report each batch to the run, so
/// their deliveries are on the stories too.
#[test]
fn a_notifier_process_reports_its_deliveries_for_the_stories() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_scenario(
        Backend::Services,
        &root().join("tests/fixtures/html/broken.toml"),
        dir.path(),
        &["--components", "process"],
    );
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    let r = ran.json();
    assert!(r["components"]["processes_started"].as_u64().unwrap() > 0, "the notifiers ran as processes");
    let stories = r["stories"].as_array().expect("stories");
    let dups: Vec<_> = stories.iter().filter(|s| s["anomaly"] == "duplicate effect").collect();
    assert!(!dups.is_empty(), "no duplicate effect's story: {}", r["anomalies"]);
    for dup in dups {
        deliveries_cover_receipts(dup, receipts_of(&r, dup));
    }
}

#[test]
fn a_passing_run_draws_its_page_on_the_services() {
    a_passing_run_draws_its_page(Backend::Services);
}

#[test]
fn a_passing_run_draws_its_page_embedded() {
    a_passing_run_draws_its_page(Backend::Embedded);
}

#[test]
fn a_failing_run_tells_each_examples_story_on_the_services() {
    a_failing_run_tells_each_examples_story(Backend::Services);
}

#[test]
fn a_failing_run_tells_each_examples_story_embedded() {
    a_failing_run_tells_each_examples_story(Backend::Embedded);
}

#[test]
fn report_html_refuses_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = run(chaos().arg("report").arg(dir.path().join("nope.json")).arg("--html"));
    let not_a_report = dir.path().join("other.json");
    std::fs::write(&not_a_report, "{\"hello\": 1}").unwrap();
    let other = run(chaos().arg("report").arg(&not_a_report).arg("--html"));
    let folder = run(chaos().arg("report").arg(dir.path()).arg("--html"));
    for (what, ran) in [("a missing file", missing), ("a JSON that is no report", other), ("a folder", folder)] {
        assert_eq!(ran.code, 2, "{what}: {}", ran.stderr);
        assert_eq!(ran.stderr.trim().lines().count(), 1, "{what}: one line, got:\n{}", ran.stderr);
        assert!(ran.stdout.is_empty(), "{what}: nothing on stdout: {}", ran.stdout);
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no page written for bad input");
}
