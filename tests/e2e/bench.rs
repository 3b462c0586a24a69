//! A small `chaos bench` on the real services: every figure is produced and
//! written to the JSON report. No timing is asserted: targets belong in the
//! benchmark's own output.

use crate::common::*;

#[test]
fn small_bench_reports_every_figure() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.args([
        "bench",
        "--payments",
        "2000",
        "--pgbench-seconds",
        "2",
        "--pgbench-clients",
        "4",
        "--runs",
        "2",
        "--warmup",
        "1",
        "--emails-off",
        "--json",
        "--reports-dir",
    ])
    .arg(dir.path());
    Backend::Services.apply(&mut c);
    let ran = run(&mut c);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let f = ran.json();
    assert_eq!(f["backends"], "postgresql + kafka");
    assert_eq!(f["events"], 4000, "every distinct event is counted once");
    // scripts/services.sh makes `chaos` a superuser, so every timed stretch
    // starts right after a checkpoint.
    assert_eq!(f["checkpoint_before_each_run"], true, "{}", ran.stderr);
    for key in [
        "end_to_end_events_per_s",
        "workload_events_per_s",
        "relay_messages_per_s",
        "notifier_events_per_s",
        "peak_rss_mb",
        "pgbench_tps",
        "ratio_to_pgbench",
    ] {
        assert!(f[key].as_f64().unwrap() > 0.0, "{key} = {}", f[key]);
    }
    let l = &f["latency_ms"];
    assert_eq!(l["events"], 4000);
    assert!(l["p50"].as_f64().unwrap() <= l["p95"].as_f64().unwrap());
    assert!(l["p95"].as_f64().unwrap() <= l["p99"].as_f64().unwrap());
    assert!(l["p99"].as_f64().unwrap() <= l["max"].as_f64().unwrap());
    let targets = f["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 6);
    // Targets are looked up by what they say, not by their place in the list.
    let target = |starts: &str| {
        targets
            .iter()
            .find(|t| t["target"].as_str().unwrap().starts_with(starts))
            .unwrap_or_else(|| panic!("no target starting {starts:?}: {targets:?}"))
    };
    // A 2,000-payment run is not the size the ratio targets speak of.
    assert!(target("end-to-end events/s ≥ 2.5 × pgbench")["met"].is_null());
    assert!(target("emails on ≥ 90% of emails off")["met"].is_null());
    assert_eq!(f["targets_missed"], serde_json::json!([]), "none judged is none missed");
    let invariants = target("every invariant holds");
    assert_eq!(invariants["met"], true, "the run's invariants held");
    // Two pipeline runs: both listed, and the figures are one of them.
    let runs = f["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["verdict"] == "pass" && r["end_to_end_events_per_s"].as_f64().unwrap() > 0.0));
    assert_ne!(runs[0]["run_id"], runs[1]["run_id"]);
    let shown = runs.iter().find(|r| r["run_id"] == f["run_id"]).expect("the figures are one run's");
    assert_eq!(shown["end_to_end_events_per_s"], f["end_to_end_events_per_s"]);
    // The warm-up run is listed apart, and its invariants count.
    let warm = f["warmup_runs"].as_array().unwrap();
    assert_eq!(warm.len(), 1);
    assert_eq!(warm[0]["verdict"], "pass");
    assert!(runs.iter().all(|r| r["run_id"] != warm[0]["run_id"]));
    // `--emails-off`: each timed run followed by one without receipt
    // emails, its invariants counted too.
    let off = &f["emails_off_mode"];
    let off_runs = off["runs"].as_array().unwrap();
    assert_eq!(off_runs.len(), 2, "{off}");
    assert!(off_runs.iter().all(|r| r["verdict"] == "pass" && r["run_id"] != f["run_id"]));
    assert!(off["end_to_end_events_per_s"].as_f64().unwrap() > 0.0, "{off}");
    // Its ratio is taken pair by pair: each off run over the in-process run
    // of its round, and the median of those (of two, their mean).
    let rate = |r: &serde_json::Value| r["end_to_end_events_per_s"].as_f64().unwrap();
    let pairs: Vec<f64> = off["pair_ratios"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
    let expected: Vec<f64> = off_runs.iter().zip(runs).map(|(o, i)| rate(o) / rate(i)).collect();
    assert_eq!(pairs.len(), 2, "{off}");
    for (got, want) in pairs.iter().zip(&expected) {
        assert!((got - want).abs() < 1e-9, "pair ratio {got} is not off over on, {want}");
    }
    // The emails' own CPU: each round's CPU with them less without, per
    // payment, the median; every timed run says its CPU.
    let cpu = |r: &serde_json::Value| r["cpu_s"].as_f64().unwrap_or_else(|| panic!("no cpu_s in {r}"));
    let per_email: Vec<f64> = runs.iter().zip(off_runs).map(|(on, off)| (cpu(on) - cpu(off)) * 1e6 / 2_000.0).collect();
    let us = f["emails_cpu_us"].as_f64().expect("emails_cpu_us");
    assert!((us - (per_email[0] + per_email[1]) / 2.0).abs() < 1e-6, "{us} from {per_email:?}");
    assert!(runs.iter().chain(off_runs).all(|r| cpu(r) > 0.0));
    let median = off["ratio_to_in_process"].as_f64().unwrap();
    assert!((median - (expected[0] + expected[1]) / 2.0).abs() < 1e-9, "{off}");
    assert_eq!(invariants["measured"], "pass in 5 of 5 runs");
    let saved = dir.path().join(format!("{}.bench.json", f["run_id"].as_str().unwrap()));
    assert!(saved.exists());
}

/// A bench that misses a target exits 6 and says which: here a peak RSS
/// budget no run can meet. Its invariants held, so without the budget it
/// would exit 0.
#[test]
fn a_missed_target_exits_6_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = chaos();
    c.args(["bench", "--payments", "2000", "--pgbench-seconds", "1", "--pgbench-clients", "2", "--max-rss-mb", "1"])
        .args(["--json", "--reports-dir"])
        .arg(dir.path());
    Backend::Services.apply(&mut c);
    let ran = run(&mut c);
    assert_eq!(ran.code, 6, "{}\n{}", ran.stdout, ran.stderr);
    let f = ran.json();
    assert_eq!(f["verdict"], "pass", "the invariants held: only the target was missed");
    assert_eq!(f["targets_missed"], serde_json::json!(["peak RSS ≤ 1 MB (--max-rss-mb)"]));
    let budget = f["targets"].as_array().unwrap().iter().find(|t| t["target"] == "peak RSS ≤ 1 MB (--max-rss-mb)");
    assert_eq!(budget.expect("the budget is a target")["met"], false);
}

#[test]
fn run_counts_out_of_range_are_bad_input() {
    let ran = run(chaos().args(["bench", "--runs", "0"]));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("--runs"), "{}", ran.stderr);
    let ran = run(chaos().args(["bench", "--warmup", "11"]));
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("--warmup"), "{}", ran.stderr);
    // The payment count goes through the scenario's own validation.
    let mut c = chaos();
    c.args(["bench", "--payments", "0"]);
    Backend::Embedded.apply(&mut c);
    let ran = run(&mut c);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("--payments is 0; expected an integer from 1 to 10000000"), "{}", ran.stderr);
}
