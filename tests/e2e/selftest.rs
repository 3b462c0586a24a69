//! `chaos selftest` on both backends: every classic mistake is caught, and
//! the correct pipeline is clean under all the faults that catch them.

use crate::common::*;

/// Every run is judged by the core checker and the payments checker
/// composed: both must catch the catalogue, the core by the pipeline's own
/// declaration alone.
fn selftest_catches_every_variant_with(backend: Backend, components: &str) {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("selftest.junit.xml");
    let mut c = chaos();
    // Three runs at once: each mostly waits on its faults and its drain
    // (an embedded selftest took 155 s one at a time, 89 s three at once).
    c.args(["selftest", "--json", "--clean-seeds", "2", "--jobs", "3", "--components", components, "--reports-dir"])
        .arg(dir.path());
    c.arg("--junit").arg(&junit);
    backend.apply(&mut c);
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "selftest on {backend:?} must pass\nstdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let s = ran.json();
    assert!(chaos::CATALOGUE.len() >= 15, "the catalogue lost variants");
    // The variants whose fault needs the fault proxy run on PostgreSQL only,
    // and are named as left out elsewhere.
    let postgres = matches!(backend, Backend::Services | Backend::PostgresMock);
    let (runnable, left_out): (Vec<_>, Vec<_>) = chaos::CATALOGUE.iter().partition(|v| postgres || !v.needs_postgres);
    let n = runnable.len();
    assert_eq!(s["variants"], n);
    assert_eq!(s["caught"], n, "{s:#}");
    assert_eq!(s["correct_clean"], true);
    let skipped: Vec<&str> = s["skipped"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(skipped, left_out.iter().map(|v| v.name).collect::<Vec<_>>());
    let rows = s["rows"].as_array().unwrap();
    // Three at once, the rows still in the catalogue's order, the correct
    // pipeline last.
    let order: Vec<&str> = rows.iter().map(|r| r["variant"].as_str().unwrap()).collect();
    let catalogue: Vec<&str> = runnable.iter().map(|v| v.name).chain(["correct pipeline"]).collect();
    assert_eq!(order, catalogue);
    // The catalogue is the list: a variant added there is checked here.
    let expected = runnable.iter().map(|v| (v.name, v.expected.as_str()));
    for (variant, anomaly) in expected {
        let row = rows.iter().find(|r| r["variant"] == variant).unwrap_or_else(|| panic!("no row for {variant}"));
        assert_eq!(row["expected"], anomaly);
        assert!(row["found"].as_str().unwrap().ends_with(anomaly), "{row}");
    }
    let clean = rows.iter().find(|r| r["variant"] == "correct pipeline").unwrap();
    assert_eq!(clean["runs"], 2);
    // The core checker, from the pipeline's declaration alone, names each
    // variant's anomaly too, but for the mistakes only the payments'
    // own checks can name: an id the consumer or the relay made up is no
    // outbox event to the core, a dual write's payments have no events in
    // the outbox, nor do those whose rows a relay deleted before it
    // published them (the core reads the outbox table, which no longer
    // holds them), a payment retried under a new id is an operation never
    // asked for, and the stale projection is the declaration's check.
    let core_names = |variant: &str| match variant {
        "consumer-made id" => Some("misattributed effect"),
        "relay-minted id" => Some("foreign event"),
        "dual write" | "delete before publish" => Some("lost operation"),
        "last write wins" => Some("failed check"),
        "retry without idempotency key" => Some("phantom operation"),
        _ => None,
    };
    let mut unnamed = Vec::new();
    for r in rows {
        let variant = r["variant"].as_str().unwrap();
        let core: Vec<&str> =
            r["core"].as_array().map(|a| a.iter().map(|v| v.as_str().unwrap()).collect()).unwrap_or_default();
        if variant == "correct pipeline" {
            assert!(core.is_empty(), "the core flagged the correct pipeline: {core:?}");
            continue;
        }
        let wanted = core_names(variant).unwrap_or_else(|| r["expected"].as_str().unwrap());
        if !core.iter().any(|a| a.ends_with(&format!("× {wanted}"))) {
            unnamed.push(format!("{variant}: the core checker should name {wanted:?}: {core:?}"));
        }
    }
    assert!(unnamed.is_empty(), "{}", unnamed.join("\n"));
    // The same verdicts as JUnit XML, read back with quick-junit: a case per
    // variant run, one for the correct pipeline, a skipped one per left out.
    let xml = std::fs::read_to_string(&junit).expect("the JUnit file");
    validate_junit(&junit);
    let back = quick_junit::Report::deserialize_from_str(&xml).expect("JUnit XML quick-junit reads");
    let suite = &back.test_suites[0];
    assert_eq!((suite.tests, suite.failures, suite.errors), (n + 1 + left_out.len(), 0, 0), "{xml}");
    let skipped_cases =
        suite.test_cases.iter().filter(|c| matches!(c.status, quick_junit::TestCaseStatus::Skipped { .. })).count();
    assert_eq!(skipped_cases, left_out.len());
    eprintln!(
        "selftest on {backend:?}, components {components}: {:.0}s, runs per variant: {:?}",
        ran.elapsed.as_secs_f64(),
        rows.iter().map(|r| r["runs"].as_u64().unwrap()).collect::<Vec<_>>()
    );
}

/// Judged by both verifiers on SQLite too: the declaration's SQL runs on
/// both backends.
#[test]
fn selftest_embedded() {
    selftest_catches_every_variant_with(Backend::Embedded, "in-process");
}

/// The catalogue on the real services: the core checker's proof too.
#[test]
fn selftest_on_postgres_and_kafka() {
    selftest_catches_every_variant_with(Backend::Services, "in-process");
}

/// Every relay and notifier an OS process: each crash at a fault point is
/// the harness's SIGKILL, each stall its SIGSTOP.
#[test]
fn selftest_on_postgres_and_kafka_as_processes() {
    selftest_catches_every_variant_with(Backend::Services, "process");
}

/// The same on SQLite and the mock cluster: the child processes reach the
/// mock through its TCP port and SQLite through the run's file.
#[test]
fn selftest_embedded_as_processes() {
    selftest_catches_every_variant_with(Backend::Embedded, "process");
}

#[test]
fn selftest_table_prints_the_mutation_score() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.args(["selftest", "--only", "dual write", "--reports-dir"]).arg(dir.path());
    Backend::Embedded.apply(&mut c);
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("│ dual write"), "{}", ran.stdout);
    assert!(ran.stdout.contains("mutation score: 1/1 variants caught"), "{}", ran.stdout);
}
