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
