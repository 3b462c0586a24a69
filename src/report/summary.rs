//! A run in a few lines that fit a terminal: the verdict first, then the
//! harm (for a failure: in the user's words, each anomaly by name, one
//! example and its cause), the effects, the
//! topic, the faults that fired, the checks, where the report is and how
//! to replay it. `chaos run` prints this; `--tables` prints every table.

use super::Report;
use crate::verifier::Verdict;

/// The width a summary fits when the terminal does not say (`COLUMNS`).
pub const DEFAULT_WIDTH: usize = 100;

/// The terminal's width: `COLUMNS` when set and sane, else [`DEFAULT_WIDTH`].
pub fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|w| (40..=1000).contains(w))
        .unwrap_or(DEFAULT_WIDTH)
}

/// The summary of `r`, every line at most `width` characters.
pub fn render(r: &Report, html: &str, width: usize) -> String {
    let mut lines: Vec<(String, String)> = Vec::new();
    let infra = match (r.infra.database.as_str(), r.infra.broker.contains("mock")) {
        ("sqlite", true) => "embedded",
        ("sqlite", false) => "SQLite + Kafka",
        (_, true) => "PostgreSQL + mock Kafka",
        _ => "PostgreSQL + Kafka",
    };
    let head = format!(
        "{:<5} {} · seed {} · {infra} · {:.1} s",
        r.verdict.as_str().to_uppercase(),
        r.scenario.name,
        r.seed,
        r.timings.total_ms as f64 / 1000.0
    );
    let judged = !matches!(r.verdict, Verdict::Incomplete | Verdict::Interrupted);
    harm_lines(&mut lines, r, width);
    if judged {
        effects_lines(&mut lines, r);
    }
    fault_lines(&mut lines, r, width);
    if judged {
        lines.push(("checks".into(), checks_line(r)));
    }
    match r.verdict {
        Verdict::Pass => {}
        // Nothing broke: the reason is all there is to read, and the fix it
        // names comes at its end, so it wraps rather than being cut.
        Verdict::Inconclusive => {
            wrap(&mut lines, "why", r.reason.split_whitespace().map(String::from).collect(), " ", width)
        }
        _ => lines.push(("why".into(), r.reason.clone())),
    }
    lines.push(("report".into(), html.to_string()));
    lines.push(("replay".into(), r.replay.clone()));

    let mut out = fit(&head, width);
    out.push('\n');
    for (label, text) in lines {
        out.push_str(&fit(&format!("  {label:<9} {text}"), width));
        out.push('\n');
    }
    out
}

/// The harm in the user's words first, then every anomaly by name, then
/// one example and what caused it. Nothing when no harm was found. The
/// HTML page opens with the same lines.
pub(crate) fn harm_lines(lines: &mut Vec<(String, String)>, r: &Report, width: usize) {
    let harmful: Vec<_> = r.anomalies.iter().filter(|a| !a.allowed).collect();
    let Some(worst) = harmful.first() else { return };
    let named: Vec<String> = harmful.iter().map(|a| format!("{} × {}", a.count, a.name)).collect();
    let said = harm(worst, &r.counts);
    if let [only] = named.as_slice() {
        // The harm in other words than the anomaly's, or the name once.
        let line = if said == *only { said } else { format!("{said} ({only})") };
        lines.push(("harm".into(), line));
    } else {
        lines.push(("harm".into(), said));
        wrap(lines, "", named, " · ", width);
    }
    if let Some(e) = worst.examples.first() {
        lines.push(("example".into(), e.clone()));
    }
    if let Some(f) = worst.followed.iter().find(|f| f.example == 0) {
        let cause = f.faults.first().map_or_else(|| f.suspects(""), |s| s.describe());
        lines.push(("cause".into(), cause));
    }
}

/// What the run's operations came to: a declared system's operations and
/// events, or the payments' receipts and emails; then the topic.
fn effects_lines(lines: &mut Vec<(String, String)>, r: &Report) {
    match &r.system {
        Some(f) => {
            lines.push((
                "effects".into(),
                format!(
                    "{} operations: {} acknowledged, {} refused, {} ambiguous → {} events",
                    f.operations, f.acknowledged, f.refused, f.ambiguous, f.outbox_events
                ),
            ));
            lines.push(("topic".into(), format!("{} messages ({} duplicates)", f.messages, f.duplicate_messages)));
        }
        None => {
            let c = &r.counts;
            let mut effects = format!(
                "{} payments → {} receipts ({} missing, {} doubled)",
                c.payments_captured, c.receipts, c.payments_without_receipt, c.payments_with_many_receipts
            );
            if let Some(sent) = c.emails_sent {
                effects.push_str(&format!(" · {sent} emails"));
            }
            lines.push(("effects".into(), effects));
            lines.push((
                "topic".into(),
                format!(
                    "{} messages for {} events ({} duplicates)",
                    c.topic_messages, c.outbox_events, c.topic_duplicates
                ),
            ));
        }
    }
}

/// Every fault that fired or could have, with its confirmation mark: its
/// items wrap onto more lines rather than being cut.
fn fault_lines(lines: &mut Vec<(String, String)>, r: &Report, width: usize) {
    let fired: Vec<String> = r
        .faults
        .iter()
        .filter(|f| f.fired > 0 || f.probability > 0.0)
        .map(|f| {
            let mark = match (f.fired > 0 && f.confirmed > 0 && f.confirmed + f.preempted >= f.fired, f.preempted) {
                (true, 0) => "✔".to_string(),
                (true, p) => format!("({p} pre-empted) ✔"),
                (false, 0) => format!("({} confirmed) ✘", f.confirmed),
                (false, p) => format!("({} confirmed, {p} pre-empted) ✘", f.confirmed),
            };
            format!("{} {} {mark}", f.point, f.fired)
        })
        .collect();
    if fired.is_empty() {
        lines.push(("faults".into(), "none set".into()));
    }
    wrap(lines, "faults", fired, " · ", width);
}

/// How many invariants and chaos checks held.
fn checks_line(r: &Report) -> String {
    let held = r.invariants.iter().filter(|i| i.ok).count();
    let chaos = r.chaos_checks.iter().filter(|i| i.ok).count();
    format!("{held} of {} invariants hold · {chaos} of {} chaos checks", r.invariants.len(), r.chaos_checks.len())
}

/// Items joined by `sep` (" · ") onto as many labelled lines as they need
/// to fit `width`, the label on the first.
fn wrap(lines: &mut Vec<(String, String)>, label: &str, items: Vec<String>, sep: &str, width: usize) {
    let room = width.saturating_sub(12).max(20);
    let mut current = String::new();
    let mut first = true;
    for item in items {
        if !current.is_empty() && current.chars().count() + sep.chars().count() + item.chars().count() > room {
            lines.push((if first { label } else { "" }.into(), std::mem::take(&mut current)));
            first = false;
        }
        if !current.is_empty() {
            current.push_str(sep);
        }
        current.push_str(&item);
    }
    if !current.is_empty() {
        lines.push((if first { label } else { "" }.into(), current));
    }
}

/// An anomaly's harm in the words of the people it happened to: "61
/// payments got 2 or more receipts", where the counts say so; its count
/// and name otherwise.
fn harm(a: &crate::verifier::Anomaly, c: &crate::verifier::reconcile::Counts) -> String {
    let n = a.count;
    match a.name.as_str() {
        "duplicate effect" if c.payments_with_many_receipts > 0 => {
            format!("{} payments got 2 or more receipts", c.payments_with_many_receipts)
        }
        "missing effect" if c.payments_without_receipt > 0 => {
            format!("{} captured payments got no receipt", c.payments_without_receipt)
        }
        "duplicate effect" => format!("{n} effects were applied more than once"),
        "missing effect" => format!("{n} effects were never applied"),
        "lost payment" => format!("{n} committed payments are gone"),
        "phantom payment" => format!("{n} payments exist that no one committed"),
        "lost event" => format!("{n} events never reached the topic"),
        "unpublished leftover" => format!("{n} outbox rows were never published"),
        "message mismatch" => format!("{n} messages differ from the rows they publish"),
        "stale projection" => format!("{n} payments show a stale status"),
        "counter drift" => format!("{n} counters do not add up"),
        "duplicate external effect" => format!("{n} payments' emails went out more than once"),
        "missing external effect" => format!("{n} captured payments got no email"),
        "lost operation" => format!("{n} acknowledged operations left no event"),
        "phantom operation" => format!("{n} events belong to no acknowledged operation"),
        "failed check" => format!("{n} of your checks found rows"),
        "stalled consumer" => format!("{n} pieces of accepted work were still pending when the run ended"),
        "stalled relay" => format!("{n} outbox rows were never published, even once the faults had stopped"),
        "split key" => format!("{n} keys' messages landed on more than one partition"),
        _ => format!("{n} × {}", a.name),
    }
}

/// Text whose every line fits `width` characters: a longer line breaks at
/// its spaces, its continuations indented by two; a word longer than the
/// line is cut. Lines that fit (a table's) are left as they are.
pub fn wrap_text(text: &str, width: usize) -> String {
    let width = width.max(20);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, end) = line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"));
        if body.chars().count() <= width {
            out.push_str(line);
            continue;
        }
        let mut current = String::new();
        for word in body.split(' ').filter(|w| !w.is_empty()) {
            if !current.trim().is_empty() && current.chars().count() + 1 + word.chars().count() > width {
                out.push_str(&fit(&current, width));
                out.push('\n');
                current = "  ".to_string();
            } else if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push_str(&fit(&current, width));
        out.push_str(end);
    }
    out
}

/// A line cut to `width` characters, with "…" where it was cut.
fn fit(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::{Anomaly, Invariant};

    fn report() -> Report {
        // A real run's report (scenarios/smoke.toml, embedded), trimmed.
        let json = include_str!("../../tests/fixtures/reports/smoke.json");
        serde_json::from_str(json).expect("the fixture report")
    }

    #[test]
    fn a_failure_leads_with_its_harm_and_every_line_fits() {
        let mut r = report();
        r.verdict = Verdict::Fail;
        r.anomalies = vec![Anomaly {
            name: "duplicate effect".into(),
            count: 135,
            examples: vec!["payment 01a2… got 2 receipts ".repeat(20)],
            allowed: false,
            subjects: vec![],
            followed: vec![],
            found_by: vec![],
        }];
        r.invariants = vec![Invariant::eq("exactly one receipt per captured payment", 1, 2)];
        let s = render(&r, "reports/x.html", 80);
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].starts_with("FAIL "), "{s}");
        assert!(
            lines[1].contains("harm") && lines[1].contains("135 effects were applied more than once (135 × duplicate"),
            "{s}"
        );
        assert!(lines[2].contains("example") && lines[2].contains("payment 01a2"), "{s}");
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "{s}");
        assert!(s.contains("0 of 1 invariants hold"), "{s}");
        assert!(s.contains("  why "), "{s}");
        assert!(lines.len() <= 15, "{s}");
    }

    #[test]
    fn a_failure_names_every_anomaly_and_its_examples_cause() {
        use crate::verifier::attribution::{By, Followed, Suspect};
        let mut r = report();
        r.verdict = Verdict::Fail;
        r.counts.payments_with_many_receipts = 61;
        let followed = vec![Followed {
            example: 0,
            subject: uuid::Uuid::nil().to_string(),
            trace_ms: 900,
            faults: vec![Suspect {
                point: "relay.after_produce".into(),
                component: "relay-1".into(),
                at_ms: 825,
                before_ms: 75,
                hit: "batch".into(),
                by: By::Data,
                matched: Some("its batch (outbox seq 1..=22) held seq 1".into()),
            }],
        }];
        let anomaly = |name: &str, count, followed| Anomaly {
            name: name.into(),
            count,
            examples: vec![format!("{name} example")],
            allowed: false,
            subjects: vec![],
            followed,
            found_by: vec![],
        };
        r.anomalies = vec![anomaly("duplicate effect", 122, followed), anomaly("counter drift", 46, vec![])];
        let s = render(&r, "reports/x.html", 100);
        let lines: Vec<&str> = s.lines().map(str::trim_end).collect();
        assert_eq!(lines[1], "  harm      61 payments got 2 or more receipts", "{s}");
        assert_eq!(lines[2], "            122 × duplicate effect · 46 × counter drift", "{s}");
        assert_eq!(lines[3], "  example   duplicate effect example", "{s}");
        assert_eq!(
            lines[4], "  cause     relay.after_produce on relay-1 at 0.825 s: its batch (outbox seq 1..=22) held seq 1",
            "{s}"
        );
    }

    /// An inconclusive run's reason ends with its fix: it wraps, whole.
    #[test]
    fn an_inconclusive_reason_wraps_rather_than_being_cut() {
        let mut r = report();
        r.verdict = Verdict::Inconclusive;
        r.reason =
            format!("the chaos did not happen: {} set `[nemesis] aimed = \"per-occurrence\"`", "word ".repeat(40));
        let s = render(&r, "reports/x.html", 80);
        assert!(s.lines().all(|l| l.chars().count() <= 80), "{s}");
        assert!(!s.contains('…'), "{s}");
        let why: Vec<&str> =
            s.lines().skip_while(|l| !l.starts_with("  why ")).take_while(|l| !l.starts_with("  report")).collect();
        assert!(why.len() > 1, "{s}");
        let joined: Vec<&str> = why.iter().flat_map(|l| l.split_whitespace()).skip(1).collect();
        assert_eq!(joined.join(" "), r.reason.split_whitespace().collect::<Vec<_>>().join(" "), "nothing lost");
    }

    #[test]
    fn a_pass_has_no_harm_and_no_reason() {
        let mut r = report();
        r.verdict = Verdict::Pass;
        r.anomalies.clear();
        r.invariants.iter_mut().for_each(|i| i.ok = true);
        let s = render(&r, "reports/x.html", 100);
        assert!(s.starts_with("PASS "), "{s}");
        assert!(!s.contains("harm") && !s.contains("  why "), "{s}");
        assert!(s.contains("replay    chaos run"), "{s}");
    }

    #[test]
    fn every_fault_that_fired_is_shown_within_the_width() {
        let r = report();
        let s = render(&r, "reports/x.html", 80);
        for f in r.faults.iter().filter(|f| f.fired > 0) {
            assert!(s.contains(&format!("{} {}", f.point, f.fired)), "{} missing:\n{s}", f.point);
        }
        assert!(s.lines().all(|l| l.chars().count() <= 80), "{s}");
    }

    #[test]
    fn long_lines_wrap_at_spaces_and_tables_stay() {
        let text = "infra: SQLite /tmp/x/20261203-115400-5873.sqlite (embedded) · librdkafka mock cluster 127.0.0.1:35961\n│ a ┆ b │\n";
        let w = wrap_text(text, 40);
        assert!(w.lines().all(|l| l.chars().count() <= 40), "{w}");
        assert_eq!(w.lines().next(), Some("infra: SQLite"), "{w}");
        assert!(w.lines().nth(1).unwrap().starts_with("  /tmp/x/"), "{w}");
        assert!(w.ends_with("│ a ┆ b │\n"), "{w}");
        let joined: String = w.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(joined, text.split_whitespace().collect::<Vec<_>>().join(" "), "nothing lost");
    }

    #[test]
    fn cutting_marks_the_cut() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
    }
}
