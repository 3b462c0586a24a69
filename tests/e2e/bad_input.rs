//! Bad input never runs anything: every broken scenario file makes `chaos run`
//! exit 2 with one `error: ` line on stderr that names the file, the line and
//! column where there is one, and what was wrong.
//!
//! The cases are the files in `tests/fixtures/bad/`. A TOML fixture carries its
//! expectations in its leading comments:
//!
//! ```text
//! # expect: <fragment the message must contain>   (one or more)
//! # at: <line>:<column>                           (omit when there is no location)
//! ```
//!
//! A fixture that cannot hold comments (empty, whitespace only, JSON, prose)
//! has the same lines, without `# `, in `<name>.expect` next to it.
//!
//! No database or broker is needed: `DATABASE_URL` and `KAFKA_BROKERS` are
//! removed, so a case that wrongly validated would start an embedded run and
//! write a report, which the test catches.

use proptest::prelude::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FIXTURES: &str = "tests/fixtures/bad";

/// A case that wrongly passed validation would run a real (embedded) pipeline;
/// stop it rather than hang the suite.
const TIMEOUT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What one `chaos run` did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// Whatever appeared in `--reports-dir`.
    reports: Vec<String>,
    timed_out: bool,
}

/// Runs `chaos run <scenario> --reports-dir <fresh tempdir>` from the crate
/// root, with no infrastructure configured.
fn run_chaos(scenario: &str) -> Ran {
    let reports = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .current_dir(root())
        .args(["run", scenario, "--reports-dir"])
        .arg(reports.path())
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chaos");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + TIMEOUT;
    let (code, timed_out) = loop {
        if let Some(status) = child.try_wait().expect("wait for chaos") {
            break (status.code(), false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut found: Vec<String> = std::fs::read_dir(reports.path())
        .expect("read reports dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    Ran { code, stdout: out.join().unwrap(), stderr: err.join().unwrap(), reports: found, timed_out }
}

/// Checks everything a bad-input run must satisfy; returns what was wrong.
/// `at` is `Some("3:1")` when the message must carry that location, `None`
/// when it must carry none.
fn check(shown: &str, ran: &Ran, at: Option<&str>, expect: &[String]) -> Vec<String> {
    let mut wrong = Vec::new();
    if ran.timed_out {
        wrong.push(format!("did not exit within {TIMEOUT:?}: the file was accepted and a run started"));
    }
    if ran.code != Some(2) {
        wrong.push(format!("exit code {:?}, expected 2 (bad input)", ran.code));
    }
    for (name, text) in [("stdout", &ran.stdout), ("stderr", &ran.stderr)] {
        if text.contains("panicked") || text.contains("RUST_BACKTRACE") {
            wrong.push(format!("{name} shows a panic"));
        }
    }
    if !ran.stdout.is_empty() {
        wrong.push(format!("stdout is not empty: {:?}", ran.stdout));
    }
    if !ran.reports.is_empty() {
        wrong.push(format!("something was written to --reports-dir: {:?}", ran.reports));
    }
    let lines: Vec<&str> = ran.stderr.lines().collect();
    if lines.len() != 1 || !ran.stderr.ends_with('\n') || ran.stderr.contains('\r') {
        wrong.push(format!("stderr is not exactly one line: {:?}", ran.stderr));
    }
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    let Some(line) = errors.first() else {
        wrong.push(format!("no line starts with `error: `: {:?}", ran.stderr));
        return wrong;
    };
    if errors.len() != 1 {
        wrong.push(format!("{} lines start with `error: `", errors.len()));
    }
    // The head is exactly "error: <file>[:line:col]: ", so a location that is
    // missing, wrong or present when there should be none all fail.
    let head = match at {
        Some(at) => format!("error: {shown}:{at}: "),
        None => format!("error: {shown}: "),
    };
    if !line.starts_with(&head) {
        wrong.push(format!("the line does not start with {head:?}: {line:?}"));
    }
    for fragment in expect {
        if !line.contains(fragment.as_str()) {
            wrong.push(format!("the line does not contain {fragment:?}: {line:?}"));
        }
    }
    wrong
}

struct Case {
    /// Relative to the crate root, as passed to `chaos run` and shown back.
    path: String,
    at: Option<String>,
    expect: Vec<String>,
}

/// Reads `expect:` and `at:` lines, with `prefix` (`"# "` inside a fixture,
/// `""` in a `.expect` file). Inside a fixture only the leading comment block
/// counts.
fn expectations(text: &str, prefix: &str, file: &str) -> (Option<String>, Vec<String>) {
    let (mut at, mut expect) = (None, Vec::new());
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            if prefix.is_empty() || !line.trim().is_empty() && !line.starts_with('#') {
                break;
            }
            continue;
        };
        if let Some(f) = rest.strip_prefix("expect:") {
            expect.push(f.trim().to_string());
        } else if let Some(l) = rest.strip_prefix("at:") {
            assert!(at.replace(l.trim().to_string()).is_none(), "{file}: more than one `at:`");
        }
    }
    if let Some(at) = &at {
        let ok = at.split_once(':').is_some_and(|(l, c)| l.parse::<u32>().is_ok() && c.parse::<u32>().is_ok());
        assert!(ok, "{file}: `at: {at}` is not <line>:<column>");
    }
    assert!(!expect.is_empty(), "{file}: no `expect:` line, so this case could not fail on its message");
    assert!(expect.iter().all(|f| !f.is_empty()), "{file}: an empty `expect:` matches anything");
    (at, expect)
}

fn cases() -> Vec<Case> {
    let dir = root().join(FIXTURES);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".expect"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let file = dir.join(&name);
            let sidecar = file.with_extension("expect");
            let (at, expect) = if sidecar.exists() {
                expectations(&std::fs::read_to_string(&sidecar).unwrap(), "", &sidecar.display().to_string())
            } else {
                let text = std::fs::read_to_string(&file).unwrap();
                expectations(&text, "# ", &file.display().to_string())
            };
            Case { path: format!("{FIXTURES}/{name}"), at, expect }
        })
        .collect()
}

/// The cases this suite promises to cover; deleting or renaming a fixture
/// fails here instead of silently shrinking the suite.
const REQUIRED: &[&str] = &[
    "unknown_top_level_key.toml",
    "unknown_key_in_relay.toml",
    "string_for_integer.toml",
    "float_for_integer.toml",
    "probability_above_one_relay_after_produce.toml",
    "probability_negative_relay_after_produce.toml",
    "probability_above_one_notifier_before_offset_commit.toml",
    "probability_negative_notifier_before_offset_commit.toml",
    "provider_fault_without_email.toml",
    "unknown_email_mode.toml",
    "payments_zero.toml",
    "negative_count.toml",
    "relay_instances_zero.toml",
    "notifier_instances_zero.toml",
    "relay_batch_size_zero.toml",
    "unknown_notifier_inbox.toml",
    "unknown_notifier_projection.toml",
    "unknown_relay_order.toml",
    "unknown_workload_publish.toml",
    "unknown_allowed_anomaly.toml",
    "unknown_relay_acks.toml",
    "bad_retention_inbox_duration.toml",
    "empty.toml",
    "whitespace_only.toml",
    "json_object.toml",
    "random_text.toml",
    "unterminated_table_header.toml",
];

#[test]
fn every_bad_fixture_exits_2_with_one_located_line() {
    let cases = cases();
    for name in REQUIRED {
        assert!(cases.iter().any(|c| c.path.ends_with(&format!("/{name}"))), "missing fixture {FIXTURES}/{name}");
    }
    let mut failures = Vec::new();
    for case in &cases {
        let ran = run_chaos(&case.path);
        let wrong = check(&case.path, &ran, case.at.as_deref(), &case.expect);
        if !wrong.is_empty() {
            failures.push(format!("{}:\n  - {}\n  stderr: {:?}", case.path, wrong.join("\n  - "), ran.stderr));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad fixtures misbehaved:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn the_fixtures_fail_the_same_way_through_the_library() {
    // The binary only prefixes "error: "; the library's message is the rest.
    for case in cases() {
        let e = chaos::scenario::load(&root().join(&case.path)).expect_err(&case.path).to_string();
        assert!(!e.contains('\n') && !e.contains('\r'), "{}: not one line: {e:?}", case.path);
        for fragment in &case.expect {
            assert!(e.contains(fragment.as_str()), "{}: {e:?} lacks {fragment:?}", case.path);
        }
    }
}

#[test]
fn a_missing_file_exits_2_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-scenario.toml");
    let shown = path.display().to_string();
    let ran = run_chaos(&shown);
    let expect = ["cannot read the scenario file".to_string(), "check the path".to_string()];
    let wrong = check(&shown, &ran, None, &expect);
    assert!(wrong.is_empty(), "{}\nstderr: {:?}", wrong.join("\n"), ran.stderr);
}

#[test]
fn a_directory_exits_2_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let shown = dir.path().display().to_string();
    let ran = run_chaos(&shown);
    let expect = ["is a directory; pass a scenario file".to_string()];
    let wrong = check(&shown, &ran, None, &expect);
    assert!(wrong.is_empty(), "{}\nstderr: {:?}", wrong.join("\n"), ran.stderr);
}

// ---------------------------------------------------------------------------
// Property: whatever the text, `parse` returns, and its error is one line that
// starts with the file name.

fn assert_one_line_error(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = chaos::scenario::parse(text, Path::new("p.toml")) {
        let msg = e.to_string();
        prop_assert!(msg.starts_with("p.toml:"), "does not start with `p.toml:`: {:?}", msg);
        prop_assert!(!msg.contains('\n') && !msg.contains('\r'), "not one line: {:?}", msg);
    }
    Ok(())
}

/// Every table with its real keys, plus a misspelling or two.
const FIXED_SECTIONS: &[(&str, &[&str])] = &[
    ("", &["name", "description", "seed", "workloads"]),
    ("workload", &["payments", "producers", "accounts", "publish", "batch"]),
    ("topic", &["partitions"]),
    (
        "relay",
        &["instances", "batch_size", "poll_interval_ms", "restart_delay_ms", "order", "event_id", "acks", "instancs"],
    ),
    ("notifier", &["instances", "batch_size", "inbox", "projection", "session_timeout_ms", "restart_delay_ms"]),
    ("retention", &["outbox", "inbox", "purge_interval_ms"]),
    ("run", &["drain_timeout_secs"]),
    ("expect", &["exactly_once", "allowed_anomalies"]),
    ("infra", &["database_url", "kafka_brokers"]),
];

/// Every table with the keys the fuzzer writes. The `[faults]` keys come
/// from the fault point registry, every one of them, plus one spelled with
/// a dot, which the file refuses.
fn sections() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut all: Vec<(&'static str, Vec<&'static str>)> =
        FIXED_SECTIONS.iter().map(|(t, k)| (*t, k.to_vec())).collect();
    let mut faults: Vec<&'static str> = chaos::faults::FaultPoint::ALL.iter().map(|p| p.key()).collect();
    faults.push("relay.after_produce");
    all.push(("faults", faults));
    all
}

/// Odd keys and key syntax, for the token soup.
const KEYS: &[&str] =
    &["seed", "instances", "inbox", "\"quoted key\"", "\"a\\rb\"", "\"a\\nb\"", "'lit\u{e9}ral'", "a.b"];

/// Values that are valid TOML, of every type, in and out of range.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "64",
    "65",
    "1000",
    "100000",
    "9223372036854775807",
    "0x10",
    "0.0",
    "0.1",
    "1.0",
    "1.5",
    "-0.1",
    "nan",
    "-inf",
    "true",
    "false",
    "1979-05-27T07:32:00Z",
    "\"7d\"",
    "\"500ms\"",
    "\"7 days\"",
    "\"on\"",
    "\"off\"",
    "\"check-then-act\"",
    "\"last-write-wins\"",
    "\"mark-then-publish\"",
    "\"dual-write\"",
    "\"\u{e9}\u{1F600}\"",
    "\"\\u0000\"",
    "\"a\\nb\"",
    "'literal'",
    "\"\"\"multi\nline\"\"\"",
    "[1, 2]",
    "{ payments = 0 }",
    "{}",
];

/// Values the grammar rejects.
const BROKEN_VALUES: &[&str] = &["1e400", "9223372036854775808", "\"unterminated", "07", "1.", "'a\nb'", "tru"];

const TOKENS: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "=",
    " = ",
    ".",
    ",",
    "{",
    "}",
    "\"",
    "'",
    "\"\"\"",
    "#",
    "\n",
    "\r\n",
    "\r",
    "\t",
    " ",
    "\\",
    "\u{e9}",
    "\u{1F600}",
    "\u{2028}",
    "\u{0}",
];

fn pick(list: &'static [&'static str]) -> impl Strategy<Value = String> {
    proptest::sample::select(list).prop_map(str::to_string)
}

/// Values of the type `key` takes, in and out of range, so that many inputs
/// deserialize and reach validation.
fn typed(table: &str, key: &str) -> &'static [&'static str] {
    match (table, key) {
        ("faults", _) => &["0.0", "0.1", "1.0", "1", "1.5", "-0.1", "10", "nan", "inf"],
        ("expect", "allowed_anomalies") => {
            &["[]", "[\"split payment\"]", "[\"no such anomaly\"]", "[1]", "\"lost event\""]
        }
        ("expect", _) => &["true", "false"],
        ("retention", "outbox" | "inbox") => &["\"7d\"", "\"30s\"", "\"500ms\"", "\"7 days\"", "\"\"", "\"d\""],
        ("workload", "publish") => &["\"outbox\"", "\"dual-write\"", "\"dual_write\""],
        ("relay", "order") => &["\"publish-then-mark\"", "\"mark-then-publish\"", "\"delete-then-publish\"", "\"\""],
        ("relay", "event_id") => &["\"outbox\"", "\"minted\"", "\"random\""],
        ("relay", "acks") => &["\"awaited\"", "\"fire-and-forget\"", "\"none\""],
        ("notifier", "inbox") => &["\"on\"", "\"off\"", "\"commit-offset-first\"", "\"maybe\""],
        ("notifier", "projection") => &["\"state-guard\"", "\"last-write-wins\"", "\"latest\""],
        ("infra", _) | ("", "name" | "description") => &["\"x\"", "\"\"", "\"\u{e9}\u{1F600}\""],
        _ => &["0", "1", "2", "-1", "-3", "64", "65", "1000", "100000", "1000001", "9223372036854775807"],
    }
}

/// One table: its header and a few of its keys, mostly with values of the
/// right type, sometimes of any type or none the grammar accepts.
fn section() -> impl Strategy<Value = String> {
    proptest::sample::select(sections()).prop_flat_map(|(table, keys)| {
        let assign = move |k: &'static str| {
            let value = prop_oneof![8 => pick(typed(table, k)), 3 => pick(VALUES), 1 => pick(BROKEN_VALUES)];
            value.prop_map(move |v| format!("{k} = {v}"))
        };
        let n = keys.len().min(3);
        proptest::sample::subsequence(keys.clone(), 0..=n)
            .prop_flat_map(move |ks| ks.into_iter().map(assign).collect::<Vec<_>>())
            .prop_map(move |lines| {
                let header = if table.is_empty() { String::new() } else { format!("[{table}]\n") };
                format!("{header}{}", lines.join("\n"))
            })
    })
}

/// Scenario-like text: mostly real sections, with broken headers, dotted keys
/// and token soup mixed in to reach the grammar's error paths.
fn tomlish() -> impl Strategy<Value = String> {
    let tables = || proptest::sample::select(sections()).prop_map(|(t, _)| if t.is_empty() { "workload" } else { t });
    let broken_header = (tables(), pick(TOKENS)).prop_map(|(t, x)| format!("[{t}{x}"));
    let dotted = (tables(), pick(KEYS), pick(VALUES)).prop_map(|(t, k, v)| format!("{t}.{k} = {v}"));
    let soup =
        proptest::collection::vec(prop_oneof![pick(TOKENS), pick(KEYS), pick(VALUES), pick(BROKEN_VALUES)], 0..6)
            .prop_map(|parts| parts.concat());
    let part = prop_oneof![12 => section(), 1 => broken_header, 1 => dotted, 1 => soup];
    (proptest::collection::vec(part, 0..4), pick(&["\n", "\r\n", "\n\n"])).prop_map(|(parts, sep)| parts.join(&sep))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn parse_never_panics_on_any_string(s in any::<String>()) {
        assert_one_line_error(&s)?;
    }

    #[test]
    fn parse_never_panics_on_tomlish_text(s in tomlish()) {
        assert_one_line_error(&s)?;
    }
}
