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
    assert!(lines[4].trim_start().starts_with("cause     ") && lines[4].contains("held"), "{}", ran.stdout);
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
