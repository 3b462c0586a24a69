//! Helpers shared by the end-to-end tests: they run the real `chaos` binary
//! against the services the test command started.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The services' endpoints. The test command (scripts/test.sh) exports both;
/// a test that cannot reach them fails rather than skipping silently.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL is not set: run the tests with scripts/test.sh, which starts PostgreSQL and Kafka")
}

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS")
        .expect("KAFKA_BROKERS is not set: run the tests with scripts/test.sh, which starts PostgreSQL and Kafka")
}

pub fn chaos() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_chaos"));
    c.current_dir(root());
    c
}

pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Ran {
    /// Stdout as JSON. A run's report (its `schema_version`, as `chaos
    /// report` knows one) is checked against the checked-in schema, so
    /// every end-to-end run holds docs/schema/report.schema.json to what
    /// `chaos` really writes.
    pub fn json(&self) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr));
        if v.get("schema_version").is_some() {
            assert_valid_report(&v);
        }
        v
    }
}

/// Panics, naming each place that fails, unless `report` validates
/// against docs/schema/report.schema.json.
pub fn assert_valid_report(report: &serde_json::Value) {
    let errors = schema_errors(report_schema(), report);
    assert!(
        errors.is_empty(),
        "the report does not validate against docs/schema/report.schema.json:\n{}",
        errors.join("\n")
    );
}

/// Every run report saved in `dir` (a sweep's runs, say) validates
/// against docs/schema/report.schema.json; returns how many there were.
pub fn assert_saved_reports_valid(dir: &Path) -> usize {
    let mut n = 0;
    for path in std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()) {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        if v.get("schema_version").is_some() {
            let errors = schema_errors(report_schema(), &v);
            assert!(
                errors.is_empty(),
                "{} does not validate against the report schema:\n{}",
                path.display(),
                errors.join("\n")
            );
            n += 1;
        }
    }
    n
}

/// Where `value` breaks `schema`, at most ten places, each as
/// `/json/pointer: what is wrong`; empty when it validates.
pub fn schema_errors(schema: &jsonschema::Validator, value: &serde_json::Value) -> Vec<String> {
    schema.iter_errors(value).take(10).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// docs/schema/report.schema.json, compiled once per test binary.
pub fn report_schema() -> &'static jsonschema::Validator {
    static SCHEMA: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| compiled("docs/schema/report.schema.json"))
}

/// docs/schema/scenario.schema.json, compiled once per test binary.
pub fn scenario_schema() -> &'static jsonschema::Validator {
    static SCHEMA: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| compiled("docs/schema/scenario.schema.json"))
}

fn compiled(file: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
    jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{file} is not a JSON Schema: {e}"))
}

pub fn run(cmd: &mut Command) -> Ran {
    let t = Instant::now();
    let Output { status, stdout, stderr } = cmd.output().expect("cannot start the chaos binary");
    Ran {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        elapsed: t.elapsed(),
    }
}

/// Which infrastructure a test body runs on. The same bodies run on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL and Apache Kafka, started by the test command.
    Services,
    /// Nothing installed: SQLite and librdkafka's mock cluster.
    Embedded,
    /// SQLite with the real Kafka.
    SqliteKafka,
    /// PostgreSQL with the mock cluster.
    PostgresMock,
}

impl Backend {
    pub fn apply(self, c: &mut Command) {
        c.env_remove("DATABASE_URL").env_remove("KAFKA_BROKERS");
        if matches!(self, Backend::Services | Backend::PostgresMock) {
            c.env("DATABASE_URL", database_url());
        }
        if matches!(self, Backend::Services | Backend::SqliteKafka) {
            c.env("KAFKA_BROKERS", brokers());
        }
    }

    /// What the report's `infra` must say.
    pub fn expected_infra(self) -> (&'static str, &'static str) {
        match self {
            Backend::Services => ("postgresql", "kafka"),
            Backend::Embedded => ("sqlite", "librdkafka mock cluster"),
            Backend::SqliteKafka => ("sqlite", "kafka"),
            Backend::PostgresMock => ("postgresql", "librdkafka mock cluster"),
        }
    }
}

/// `chaos run <scenario> --json` on `backend`, reports in `reports`.
pub fn run_scenario(backend: Backend, scenario: &Path, reports: &Path, extra: &[&str]) -> Ran {
    let mut c = chaos();
    c.arg("run").arg(scenario).arg("--json").arg("--reports-dir").arg(reports).args(extra);
    backend.apply(&mut c);
    let ran = run(&mut c);
    if ran.code == 0 || ran.code == 1 {
        let r = ran.json();
        let (db, broker) = backend.expected_infra();
        assert_eq!((r["infra"]["database"].as_str().unwrap(), r["infra"]["broker"].as_str().unwrap()), (db, broker));
    }
    ran
}

/// Every invariant of a JSON report that did not hold, by name.
pub fn violated(report: &serde_json::Value) -> Vec<String> {
    report["invariants"]
        .as_array()
        .expect("invariants")
        .iter()
        .filter(|i| !i["ok"].as_bool().unwrap())
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

/// Starts `cmd` with its output piped and returns once a line of its stderr
/// contains one of `markers`: a wait for the run to reach a phase, instead
/// of a sleep that a loaded machine outruns. The rest of stderr keeps being
/// collected; join the handle for it. Panics after `limit`.
pub fn spawn_until(
    cmd: &mut Command,
    markers: &[&str],
    limit: Duration,
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("cannot start chaos");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let markers: Vec<String> = markers.iter().map(|m| m.to_string()).collect();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if markers.iter().any(|m| line.contains(m.as_str())) {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(limit).is_err() {
        let _ = child.kill();
        panic!("chaos logged none of the awaited lines within {limit:?}");
    }
    (child, reader)
}

/// PATH with the examples' Python virtual environment first, made (or
/// found) by scripts/python-env.sh, which installs the pinned packages on a
/// fresh machine. Made once per test binary.
pub fn python_path() -> String {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let bin = BIN.get_or_init(|| made_by("scripts/python-env.sh"));
    format!("{bin}:{}", std::env::var("PATH").unwrap_or_default())
}

/// The folder with kafkajs and pg for NODE_PATH, made (or found) by
/// scripts/node-env.sh, which installs the locked packages outside the
/// repository on a fresh machine. Made once per test binary.
pub fn node_path() -> String {
    static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIR.get_or_init(|| made_by("scripts/node-env.sh")).clone()
}

/// What an environment script prints: the folder it made or found.
fn made_by(script: &str) -> String {
    let out =
        Command::new("bash").arg(root().join(script)).output().unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(out.status.success(), "{script} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A run that ended with an error before its report: its one `error:`
/// line (the banner and the logs are stderr's too), and proof that no
/// process it started (found by its `<run id>-processes` folder of logs
/// in `reports`) outlived it.
pub fn the_one_error_of_a_run_that_left_nothing(ran: &Ran, reports: &Path) -> String {
    let errors: Vec<&str> = ran.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line: {}", ran.stderr);
    let run_id = std::fs::read_dir(reports)
        .unwrap()
        .flatten()
        .find_map(|e| e.file_name().to_string_lossy().strip_suffix("-processes").map(String::from))
        .expect("the run's process logs");
    assert!(processes_of_run(&run_id).is_empty(), "a process outlived the run");
    errors[0].to_string()
}

/// Processes alive now whose environment holds `CHAOS_RUN_ID=<run_id>`:
/// what a run started and left behind.
pub fn processes_of_run(run_id: &str) -> Vec<i32> {
    let needle = format!("CHAOS_RUN_ID={run_id}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

/// The run's id is the report's; nothing it started may outlive it.
pub fn assert_nothing_left(r: &serde_json::Value) {
    let id = r["run_id"].as_str().expect("run_id");
    let left = processes_of_run(id);
    assert!(left.is_empty(), "processes of run {id} outlived it: {left:?}");
}

/// Checks a JUnit file against the schema CI systems read (junit-10.xsd,
/// fetched by scripts/junit-schema.sh) with xmllint; panics with
/// xmllint's complaint when it does not validate.
pub fn validate_junit(path: &Path) {
    let schema = Command::new("bash").arg(root().join("scripts/junit-schema.sh")).output().expect("bash");
    assert!(schema.status.success(), "scripts/junit-schema.sh failed:\n{}", String::from_utf8_lossy(&schema.stderr));
    let xsd = String::from_utf8_lossy(&schema.stdout).trim().to_string();
    let out = Command::new("xmllint").arg("--noout").arg("--schema").arg(&xsd).arg(path).output().expect("xmllint");
    assert!(
        out.status.success(),
        "{} does not validate against {xsd}:\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fault point fired at least once, at least one firing was confirmed,
/// and every firing was confirmed (for a kill: the process seen ending by
/// SIGKILL) or pre-empted by another fault, with its reason (a held COMMIT
/// whose process another kill ended first); returns how often it fired.
pub fn assert_fired_and_confirmed(r: &serde_json::Value, point: &str) -> u64 {
    let f = r["faults"].as_array().unwrap().iter().find(|f| f["point"] == point).unwrap();
    let fired = f["fired"].as_u64().unwrap();
    assert!(fired >= 1, "{point} never fired: {f}");
    let (confirmed, preempted) = (f["confirmed"].as_u64().unwrap(), f["preempted"].as_u64().unwrap_or(0));
    assert!(confirmed >= 1, "{point}: no firing confirmed: {f}");
    assert_eq!(confirmed + preempted, fired, "{point}: every firing confirmed or pre-empted: {f}");
    let why = f["preempted_why"].as_array().map_or(0, |w| w.len()) as u64;
    assert_eq!(why, preempted.min(5), "{point}: each pre-empted firing says why: {f}");
    fired
}
