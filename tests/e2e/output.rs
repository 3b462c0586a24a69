//! What `chaos run` prints for people: a summary that fits the terminal,
//! the verdict first, with every table behind `--tables`; and a fault
//! spelled either way.

use crate::common::*;

#[test]
fn a_run_prints_a_summary_that_fits_the_terminal_and_every_table_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("run.junit.xml");
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    // The key's spelling on the command line, as in the file.
    c.env("COLUMNS", "100").args([
        "run",
        "scenarios/smoke.toml",
        "--fault",
        "relay_after_produce=0.2",
        "--reports-dir",
    ]);
    c.arg(dir.path()).arg("--junit").arg(&junit);
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(lines[0].starts_with("PASS  smoke · seed 7 · embedded · "), "{}", ran.stdout);
    assert!(lines.len() <= 12, "{} lines:\n{}", lines.len(), ran.stdout);
    assert!(lines.iter().all(|l| l.chars().count() <= 100), "wider than 100 columns:\n{}", ran.stdout);
    for label in ["effects", "topic", "faults", "checks", "report", "replay"] {
        assert!(lines.iter().any(|l| l.trim_start().starts_with(label)), "no {label} line:\n{}", ran.stdout);
    }
    assert!(ran.stdout.contains("relay.after_produce"), "{}", ran.stdout);
    assert!(ran.stdout.contains("--fault relay.after_produce=0.2"), "the replay carries the override: {}", ran.stdout);
    // A passing run's SQLite file is not left in the reports folder.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".sqlite"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Unless it is asked to stay.
    let kept = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    c.args(["run", "scenarios/smoke.toml", "--payments", "50", "--keep", "--reports-dir"]).arg(kept.path());
    let ran_kept = run(&mut c);
    assert!(matches!(ran_kept.code, 0 | 4), "{}", ran_kept.stderr);
    let sqlite =
        std::fs::read_dir(kept.path()).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".sqlite"));
    assert!(sqlite, "--keep keeps the SQLite file");
    // The JUnit suite keeps its name across seeds; the seed is a property.
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("<testsuite name=\"chaos run smoke\""), "{xml}");
    assert!(xml.contains("name=\"seed\" value=\"7\""), "{xml}");

    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    c.env("COLUMNS", "100").args(["run", "scenarios/smoke.toml", "--tables", "--reports-dir"]).arg(dir.path());
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    for table in ["Verification", "Faults", "Invariants"] {
        assert!(ran.stdout.contains(table), "--tables prints the {table} table:\n{}", ran.stdout);
    }
    // The tables wrap to the terminal's width too.
    let wide: Vec<&str> = ran.stdout.lines().filter(|l| l.chars().count() > 100).collect();
    assert!(wide.is_empty(), "wider than 100 columns: {wide:#?}");
}

#[test]
fn a_failing_run_leads_with_its_harm_and_keeps_its_database() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    c.env("COLUMNS", "100").args(["run", "scenarios/inbox-off.toml", "--reports-dir"]).arg(dir.path());
    let ran = run(&mut c);
    assert_eq!(ran.code, 1, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(lines[0].starts_with("FAIL  inbox-off"), "{}", ran.stdout);
    // The harm in the user's words, every anomaly by name, an example and
    // the fault that caused it, matched by data.
    assert!(
        lines[1].trim_start().starts_with("harm") && lines[1].contains("payments got 2 or more receipts"),
        "{}",
        ran.stdout
    );
    assert!(lines[2].contains("× duplicate effect"), "{}", ran.stdout);
    assert!(lines[3].trim_start().starts_with("example   payment "), "{}", ran.stdout);
    // After the example (a long one wraps onto lines of its own), its cause.
    let cause = lines.iter().position(|l| l.trim_start().starts_with("cause     ")).expect(&ran.stdout);
    assert!(lines[4..cause].iter().all(|l| l.starts_with(&" ".repeat(12))), "{}", ran.stdout);
    assert!(labelled(&ran.stdout, "cause").join(" ").contains("held"), "{}", ran.stdout);
    assert!(lines.iter().any(|l| l.trim_start().starts_with("why")), "{}", ran.stdout);
    assert!(lines.iter().all(|l| l.chars().count() <= 100), "{}", ran.stdout);
    // Its database stays beside its report, to be looked into.
    let kept =
        std::fs::read_dir(dir.path()).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".sqlite"));
    assert!(kept, "a failing run keeps its SQLite file");
}

/// A reader that went away (`chaos init - | head -1`) ends nothing badly:
/// no panic, the command's own exit code. stdout here is a pipe whose
/// reading end is closed before `chaos` starts, so every write finds it
/// broken, whatever the timing.
#[test]
fn a_closed_stdout_is_no_error() {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors we then own; the reading end is
    // closed at once, the writing end handed to the child as its stdout.
    let closed = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        std::process::Stdio::from_raw_fd(fds[1])
    };
    let out = chaos().args(["init", "-"]).stdout(closed).output().expect("chaos runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
}

/// Issue 64: in a CI log (stdout a pipe, no `COLUMNS`) the summary is 100
/// columns wide, and nothing a user copies is cut: the `why` and the
/// `replay` wrap at their spaces, whole, the replay's rows ending with
/// ` \` so that they paste as one command. A failing run, and an
/// INCOMPLETE one whose consumer cannot start: its `why` ends with the
/// program's own last words, and no `harm` is made up for payments the
/// workload never committed.
#[test]
fn nothing_a_user_copies_is_cut_and_a_run_that_never_started_invents_no_harm() {
    let dir = tempfile::tempdir().unwrap();
    let failing = dir.path().join("failing");
    let mut c = chaos();
    Backend::Embedded.apply(&mut c);
    c.env_remove("COLUMNS").args(["run", "scenarios/inbox-off.toml", "--payments", "100"]);
    c.args(["--fault", "relay.after_produce=0.2", "--fault", "notifier.before_offset_commit=0.01", "--reports-dir"]);
    let ran = run(c.arg(&failing));
    assert_eq!(ran.code, 1, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert_whole(&ran.stdout, &saved_report(&failing));

    // A consumer that exits at once, as one that cannot reach its database.
    let scenario = dir.path().join("cannot-start.toml");
    let said = "psycopg.OperationalError: connection to server at 127.0.0.1, port 5433 failed: Connection refused";
    let command = format!(r#"["sh", "-c", "echo '{said}' >&2; exit 1"]"#);
    std::fs::write(
        &scenario,
        format!("name = \"cannot-start\"\n[workload]\npayments = 20\n[notifier]\ncommand = {command}\n"),
    )
    .unwrap();
    let incomplete = dir.path().join("incomplete");
    let mut c = chaos();
    Backend::Services.apply(&mut c);
    c.env_remove("COLUMNS").arg("run").arg(&scenario).arg("--reports-dir");
    let ran = run(c.arg(&incomplete));
    assert_eq!(ran.code, 5, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.starts_with("INCOMPLETE cannot-start"), "{}", ran.stdout);
    let r = saved_report(&incomplete);
    assert_whole(&ran.stdout, &r);
    assert!(!ran.stdout.contains("  harm "), "harm made up for a run that never started:\n{}", ran.stdout);
    assert_eq!(r["anomalies"], serde_json::json!([]), "{}", r["anomalies"]);
    let why: Vec<&str> = labelled(&ran.stdout, "why").iter().flat_map(|l| l.split_whitespace()).collect();
    assert!(why.join(" ").contains(said), "the why quotes the program's stderr:\n{}", ran.stdout);
}

/// The report a run saved in `dir`.
fn saved_report(dir: &std::path::Path) -> serde_json::Value {
    let saved = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path());
    let json = saved.into_iter().find(|p| p.extension().is_some_and(|e| e == "json")).expect("the saved report");
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// A summary's rows labelled `label`: its first and the continuations.
fn labelled<'a>(summary: &'a str, label: &str) -> Vec<&'a str> {
    let first = format!("  {label:<9} ");
    let mut rows = summary.lines().skip_while(|l| !l.starts_with(&first));
    let head = rows.next().into_iter();
    head.chain(rows.take_while(|l| l.starts_with(&" ".repeat(12)))).collect()
}

/// Every line of `summary` within 100 columns and none cut; its `why`
/// holds the report's reason word for word, its `replay` rows pasted
/// together the report's command.
fn assert_whole(summary: &str, r: &serde_json::Value) {
    assert!(summary.lines().all(|l| l.chars().count() <= 100 && !l.ends_with('…')), "{summary}");
    let why: Vec<&str> = labelled(summary, "why").iter().flat_map(|l| l.split_whitespace()).skip(1).collect();
    let reason: Vec<&str> = r["reason"].as_str().unwrap().split_whitespace().collect();
    assert_eq!(why, reason, "the why, word for word:\n{summary}");
    let rows = labelled(summary, "replay");
    let (last, before) = rows.split_last().expect("a replay line");
    assert!(before.iter().all(|l| l.ends_with(" \\")) && !last.ends_with('\\'), "{summary}");
    let pasted: Vec<&str> = rows.iter().map(|l| l[12..].trim_end_matches(" \\")).collect();
    assert_eq!(pasted.join(" "), r["replay"].as_str().unwrap(), "the replay, whole:\n{summary}");
}
