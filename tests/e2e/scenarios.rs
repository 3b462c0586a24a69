//! Every shipped scenario loads, and bad scenario files fail with one line
//! naming file, line and column, and exit code 2.

use crate::common::*;
use chaos::faults::FaultPoint;

#[test]
fn every_shipped_scenario_is_valid() {
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("scenarios")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().map(|e| e == "toml").unwrap_or(false) {
            let sc = chaos::scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // A shipped file says what its aimed rates count.
            assert_eq!(sc.aimed_warning(), None, "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 5, "expected the shipped scenarios, found {n}");
}

/// The bad fixtures whose mistake a schema can state: a wrong type, an
/// unknown key or choice, a probability out of its bounds. The others
/// (a zero count, a bad duration, one key against another) only
/// validation knows.
const REFUSED_BY_THE_SCHEMA: &[&str] = &[
    "bool_for_string",
    "float_for_integer",
    "probability_above_one_notifier_before_offset_commit",
    "probability_above_one_relay_after_produce",
    "probability_as_percent",
    "probability_negative_notifier_before_offset_commit",
    "probability_negative_relay_after_produce",
    "probability_negative_workload_poison",
    "string_for_integer",
    "string_for_probability",
    "table_as_value",
    "unknown_allowed_anomaly",
    "unknown_email_mode",
    "unknown_key_in_relay",
    "unknown_notifier_inbox",
    "unknown_notifier_projection",
    "unknown_relay_acks",
    "unknown_relay_order",
    "unknown_top_level_key",
    "unknown_workload_publish",
];

#[test]
fn every_scenario_validates_against_the_schema_and_the_bad_ones_do_not() {
    // What an editor checks a file with (docs/schema/scenario.schema.json)
    // accepts every scenario chaos ships, its examples and its test
    // fixtures, read from TOML as JSON; and is no looser than it can be.
    fn toml_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for p in std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()) {
            let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
            if p.is_dir() && !name.starts_with('.') && name != "node_modules" {
                toml_files(&p, out);
            } else if p.extension().is_some_and(|e| e == "toml") {
                out.push(p);
            }
        }
    }
    let read = |p: &std::path::Path| -> serde_json::Value {
        toml::from_str(&std::fs::read_to_string(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let mut good = Vec::new();
    for dir in ["scenarios", "examples", "tests/fixtures/html", "tests/fixtures/programs"] {
        toml_files(&root().join(dir), &mut good);
    }
    assert!(good.len() >= 40, "expected the repository's scenarios, found {}", good.len());
    for p in &good {
        let errors = schema_errors(scenario_schema(), &read(p));
        assert!(
            errors.is_empty(),
            "{} does not validate against the scenario schema:\n{}",
            p.display(),
            errors.join("\n")
        );
    }
    for name in REFUSED_BY_THE_SCHEMA {
        let p = root().join(format!("tests/fixtures/bad/{name}.toml"));
        assert!(!schema_errors(scenario_schema(), &read(&p)).is_empty(), "the scenario schema accepts {}", p.display());
    }
}

#[test]
fn payments_toml_reproduces_the_experiment() {
    let s = chaos::scenario::load(&root().join("scenarios/payments.toml")).unwrap();
    assert_eq!(s.payments, 1000);
    assert_eq!(s.relay.instances, 2);
    // 9% of full 5-event batches, retried crashes included: about 200 of
    // the 2,000 events twice on the topic (the seed's 201).
    assert_eq!(s.relay.batch_size, 5);
    assert_eq!(s.faults.get(FaultPoint::RelayAfterProduce), 0.09);
    assert_eq!(s.faults.get(FaultPoint::NotifierBeforeOffsetCommit), 0.002);
    assert!(s.exactly_once);
}

/// `chaos init` writes the scenario reference where asked, never over an
/// existing file, prints it with `-`, and what it writes runs and passes.
#[test]
fn init_writes_the_reference_which_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("my.toml");
    let wrote = run(chaos().arg("init").arg(&path));
    assert_eq!(wrote.code, 0, "{}", wrote.stderr);
    assert!(wrote.stdout.contains("chaos run"), "{}", wrote.stdout);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, std::fs::read_to_string(root().join("scenarios/reference.toml")).unwrap());
    // The user's file is never replaced.
    std::fs::write(&path, "seed = 1\n").unwrap();
    let again = run(chaos().arg("init").arg(&path));
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert_eq!(again.stderr.trim().lines().count(), 1, "one line: {}", again.stderr);
    assert!(again.stderr.contains("already exists"), "{}", again.stderr);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "seed = 1\n");
    let printed = run(chaos().args(["init", "-"]));
    assert_eq!((printed.code, printed.stdout.as_str()), (0, text.as_str()));
    // As written, it runs (embedded, fewer payments) and passes.
    let fresh = dir.path().join("fresh.toml");
    std::fs::write(&fresh, &text).unwrap();
    let ran = run_scenario(Backend::Embedded, &fresh, dir.path(), &["--payments", "100"]);
    assert_eq!(ran.code, 0, "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.json()["scenario"]["name"], "my-scenario");
}

/// `chaos init --consumer CMD` splits CMD as a shell would: a quoted
/// argument stays one; an unclosed quote is a usage error naming the fix.
#[test]
fn init_splits_a_command_as_a_shell_would() {
    let wrote = run(chaos().args(["init", "--consumer", "python3 -c 'import sys; sys.exit(1)'", "-"]));
    assert_eq!(wrote.code, 0, "{}", wrote.stderr);
    assert!(wrote.stdout.contains(r#"command = ["python3", "-c", "import sys; sys.exit(1)"]"#), "{}", wrote.stdout);
    let refused = run(chaos().args(["init", "--relay", "python3 'relay.py", "-"]));
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("unclosed quote"), "{}", refused.stderr);
}
