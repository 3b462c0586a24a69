//! A run in a few lines that fit a terminal: the verdict first, then the
//! harm (for a failure: in the user's words, each anomaly by name, one
//! example and its cause), the effects, the
//! topic, the faults that fired, the checks, where the report is and how
//! to replay it. `chaos run` prints this; `--tables` prints every table.
//! A line longer than the width wraps at its spaces, never cut: the `why`
//! and the `replay` are what a user copies out of a CI log.

use super::Report;
use crate::verifier::Verdict;

/// The width a summary fits when stdout is not a terminal and `COLUMNS`
/// does not say.
pub const DEFAULT_WIDTH: usize = 100;

/// Where a labelled line's text starts: two spaces, the label in nine
/// columns, one space. Continuation lines start there too.
const INDENT: usize = 12;

/// The width to fit: `COLUMNS` when set and sane, else the terminal's own
/// when stdout is one, else [`DEFAULT_WIDTH`].
pub fn width() -> usize {
    let sane = 40..=1000;
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|w| sane.contains(w))
        .or_else(|| terminal_width().map(|w| w.clamp(*sane.start(), *sane.end())))
        .unwrap_or(DEFAULT_WIDTH)
}

/// The columns of the terminal stdout is, if it is one.
fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: TIOCGWINSZ only fills the winsize it is given, and stdout is
    // a terminal (checked above).
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(size.ws_col as usize)
}

/// The summary of `r`, every line at most `width` characters unless one
/// word alone is longer (a path): words are never cut.
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
    if r.verdict != Verdict::Pass {
        lines.push(("why".into(), r.reason.clone()));
    }
    lines.push(("report".into(), html.to_string()));
    lines.push(("replay".into(), r.replay.clone()));

    let room = width.saturating_sub(INDENT).max(20);
    let mut out = String::new();
    for (i, row) in words(&head, width).into_iter().enumerate() {
        let indent = if i == 0 { "" } else { &" ".repeat(INDENT) };
        out.push_str(&format!("{indent}{row}\n"));
    }
    for (label, text) in lines {
        // The replay is a command: its rows end with `\` so that the
        // block pasted into a shell is one command, all of it.
        let rows = if label == "replay" { command_rows(&text, room) } else { words(&text, room) };
        for (i, row) in rows.into_iter().enumerate() {
            let label = if i == 0 { label.as_str() } else { "" };
            out.push_str(&format!("  {label:<9} {row}\n"));
        }
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

/// What the run's operations came to, and the topic, in its kind of
/// system's words.
fn effects_lines(lines: &mut Vec<(String, String)>, r: &Report) {
    lines.extend(r.shown.effects.iter().cloned());
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
/// line stays whole on a line of its own. Lines that fit (a table's) are
/// left as they are.
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
                out.push_str(&current);
                out.push('\n');
                current = "  ".to_string();
            } else if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push_str(&current);
        out.push_str(end);
    }
    out
}

/// `text` in rows of at most `room` characters, broken at its spaces; a
/// word longer than `room` has a row of its own, whole. Text that fits
/// is left as it is (the verdict's column on the first line).
fn words(text: &str, room: usize) -> Vec<String> {
    if text.chars().count() <= room {
        return vec![text.to_string()];
    }
    fill(text.split(' ').filter(|w| !w.is_empty()).map(String::from), room, "")
}

/// A shell command in rows of at most `room` characters, each but the last
/// ending with ` \`: broken only between its arguments, never inside a
/// quoted one, and an option kept with its value (`--fault point=rate`).
fn command_rows(cmd: &str, room: usize) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    for arg in shell_args(cmd) {
        match items.last_mut() {
            Some(last) if last.starts_with("--") && !last.contains(' ') && !arg.starts_with('-') => {
                last.push(' ');
                last.push_str(&arg);
            }
            _ => items.push(arg),
        }
    }
    fill(items.into_iter(), room.saturating_sub(2), " \\")
}

/// Items joined by spaces into rows of at most `room` characters, every
/// row but the last followed by `cont`.
fn fill(items: impl Iterator<Item = String>, room: usize, cont: &str) -> Vec<String> {
    let mut rows = Vec::new();
    let mut current = String::new();
    for item in items {
        if !current.is_empty() && current.chars().count() + 1 + item.chars().count() > room {
            rows.push(std::mem::take(&mut current) + cont);
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(&item);
    }
    rows.push(current);
    rows
}

/// A command's arguments as the shell splits them, each as written
/// (quotes kept): the spaces inside quotes or after a backslash are not
/// breaks.
fn shell_args(cmd: &str) -> Vec<String> {
    let (mut args, mut current) = (Vec::new(), String::new());
    let (mut single, mut double, mut escaped) = (false, false, false);
    for c in cmd.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            ' ' if !single && !double => {
                if !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.is_empty() {
        args.push(current);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::{Anomaly, Invariant};

    fn report() -> Report {
        // A real run's report (scenarios/smoke.toml, embedded), trimmed.
        let json = include_str!("../../tests/fixtures/reports/smoke.json");
        let mut r: Report = serde_json::from_str(json).expect("the fixture report");
        r.shown = crate::report::shown::Shown::payments(&r);
        r
    }

    #[test]
    fn a_failure_leads_with_its_harm_and_every_line_fits() {
        let mut r = report();
        r.verdict = Verdict::Fail;
        r.anomalies = vec![Anomaly {
            name: "duplicate effect".into(),
            count: 135,
            examples: vec!["payment 01a2… got 2 receipts ".repeat(4)],
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
        assert!(lines[3].starts_with(&" ".repeat(INDENT)) && lines[3].ends_with("got 2 receipts"), "wraps whole:\n{s}");
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "{s}");
        assert!(s.contains("0 of 1 invariants hold"), "{s}");
        assert!(s.contains("  why "), "{s}");
        assert!(lines.len() <= 16, "{s}");
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

    /// The lines of `s` from the one labelled `label` to the next label.
    fn labelled<'a>(s: &'a str, label: &str) -> Vec<&'a str> {
        let start = format!("  {label:<9} ");
        let mut rows = s.lines().skip_while(|l| !l.starts_with(&start));
        let first = rows.next().into_iter();
        first.chain(rows.take_while(|l| l.starts_with(&" ".repeat(INDENT)))).collect()
    }

    /// Whatever the verdict, the reason wraps at its spaces, whole: an
    /// inconclusive one ends with its fix, an incomplete one with the
    /// program's own last words, a failing one names pre-empted holds.
    #[test]
    fn every_reason_wraps_rather_than_being_cut() {
        for verdict in [Verdict::Fail, Verdict::Inconclusive, Verdict::Incomplete, Verdict::Interrupted] {
            let mut r = report();
            r.verdict = verdict;
            r.reason = format!(
                "{} its stderr ends: psycopg.OperationalError: connection refused (logs in reports/x-processes)",
                "word ".repeat(40)
            );
            let s = render(&r, "reports/x.html", 80);
            assert!(s.lines().all(|l| l.chars().count() <= 80), "{s}");
            assert!(!s.contains('…'), "{s}");
            let why = labelled(&s, "why");
            assert!(why.len() > 1, "{verdict:?}:\n{s}");
            let joined: Vec<&str> = why.iter().flat_map(|l| l.split_whitespace()).skip(1).collect();
            assert_eq!(joined.join(" "), r.reason.split_whitespace().collect::<Vec<_>>().join(" "), "nothing lost");
        }
    }

    /// The replay wraps between its arguments, each row but the last ending
    /// with ` \`, so that the rows pasted into a shell are the command.
    #[test]
    fn a_long_replay_wraps_as_one_shell_command() {
        let mut r = report();
        r.replay = format!(
            "chaos run scenarios/payments.toml --seed 42 {}--schedule 'relay.after_produce:1,5;notifier.before_offset_commit:3'",
            "--fault relay.after_produce=0.00001 ".repeat(4)
        );
        let s = render(&r, "reports/x.html", 80);
        let rows = labelled(&s, "replay");
        assert!(rows.len() > 1, "{s}");
        assert!(rows.iter().all(|l| l.chars().count() <= 80), "{s}");
        let (last, before) = rows.split_last().unwrap();
        assert!(before.iter().all(|l| l.ends_with(" \\")) && !last.ends_with('\\'), "{s}");
        assert!(rows.iter().all(|l| !l.ends_with("--fault \\")), "an option stays with its value:\n{s}");
        let pasted: String = rows.iter().map(|l| l[INDENT..].trim_end_matches(" \\")).collect::<Vec<_>>().join(" ");
        assert_eq!(pasted, r.replay, "nothing lost");
    }

    #[test]
    fn a_commands_arguments_are_split_as_the_shell_splits_them() {
        assert_eq!(
            shell_args(r#"chaos run 'my dir/x.toml' --x "a b" c\ d --schedule 'p:1;q:2'"#),
            ["chaos", "run", "'my dir/x.toml'", "--x", "\"a b\"", "c\\ d", "--schedule", "'p:1;q:2'"]
        );
    }

    /// A word longer than the room (a path) is never cut: it has a row of
    /// its own and overflows.
    #[test]
    fn a_word_longer_than_the_line_stays_whole() {
        let path = format!("reports/{}.html", "x".repeat(120));
        let s = render(&report(), &path, 80);
        assert!(labelled(&s, "report")[0].ends_with(&path), "{s}");
        assert_eq!(words(&format!("a {path} b"), 20), ["a", path.as_str(), "b"]);
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

    /// A declared run that waited for pending work says how long and for
    /// how much; one that found none pending says nothing of it.
    #[test]
    fn a_settle_that_waited_for_pending_work_has_its_line() {
        let mut r = report();
        r.timings.settle_ms = Some(15_010);
        let mut figures = crate::verifier::declared::Figures { pending_at_settle: Some(250), ..Default::default() };
        r.shown = crate::report::shown::Shown::declared(&r, &figures);
        let s = render(&r, "reports/x.html", 100);
        assert_eq!(labelled(&s, "settled"), ["  settled   15.0 s after the drain, for 250 rows of system.pending"]);
        figures.pending_at_settle = Some(0);
        r.shown = crate::report::shown::Shown::declared(&r, &figures);
        assert!(!render(&r, "reports/x.html", 100).contains("settled"));
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
}
