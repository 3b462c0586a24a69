//! JUnit XML for CI pages (`--junit FILE` on `chaos run` and `chaos
//! selftest`), written with `quick-junit`, the crate cargo-nextest uses.
//!
//! A run is one test suite: a test case per invariant and per chaos check,
//! and one for the run itself, which fails when the run is incomplete,
//! interrupted or inconclusive even though every invariant it checked held:
//! CI must never read green where nothing was proven. A broken invariant's
//! case carries the examples of the anomalies that broke it and the replay
//! command. The selftest is one suite with a test case per variant (caught,
//! or not, with what its last run found) and one for the correct pipeline's
//! clean runs, and a skipped case per variant the backend left out.

use crate::error::{Error, Result};
use crate::report::Report as RunReport;
use crate::verifier::{Invariant, Verdict};
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use std::path::Path;
use std::time::Duration;

/// The JUnit report of one run.
pub fn for_run(r: &RunReport) -> Report {
    // Named by the scenario alone: a CI system keeps a test's history by
    // its suite and name, and the seed changes from run to run (it is in
    // each case's replay command and in the suite's properties).
    let mut suite = TestSuite::new(format!("chaos run {}", r.scenario.name));
    suite.add_property(quick_junit::Property::new("seed", r.seed.to_string()));
    suite.set_time(Duration::from_millis(r.timings.total_ms));
    let verified = matches!(r.verdict, Verdict::Pass | Verdict::Fail);
    let status = match verified {
        true => TestCaseStatus::success(),
        false => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Error);
            s.set_message(format!("{}: {}", r.verdict.as_str(), r.reason)).set_type(r.verdict.as_str());
            s.set_description(format!("replay: {}", r.replay));
            s
        }
    };
    let mut run = TestCase::new("the run completed and was verified", status);
    run.set_classname("run").set_time(Duration::from_millis(r.timings.total_ms));
    suite.add_test_case(run);
    for i in &r.invariants {
        suite.add_test_case(check(r, i, "invariant"));
    }
    for i in &r.chaos_checks {
        suite.add_test_case(check(r, i, "chaos check"));
    }
    let mut report = Report::new("chaos");
    report.add_test_suite(suite);
    report
}

/// One invariant or chaos check: a failure carries the anomalies' examples
/// and the replay command.
fn check(r: &RunReport, i: &Invariant, class: &str) -> TestCase {
    let status = match i.ok {
        true => TestCaseStatus::success(),
        false => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(format!("expected {}, actual {}", i.expected, i.actual));
            s.set_type(if i.anomalies.is_empty() { class.to_string() } else { i.anomalies.join(", ") });
            let mut text = String::new();
            for a in r.anomalies.iter().filter(|a| i.anomalies.contains(&a.name)) {
                text.push_str(&format!("{} × {}:\n", a.count, a.name));
                for e in &a.examples {
                    text.push_str(&format!("  {e}\n"));
                }
            }
            text.push_str(&format!("replay: {}\n", r.replay));
            s.set_description(text);
            s
        }
    };
    let mut case = TestCase::new(i.name.clone(), status);
    case.set_classname(class);
    case
}

/// Writes the report to `path`; a path that cannot be written is an I/O
/// error (exit 74), named.
pub fn write(report: &Report, path: &Path) -> Result<()> {
    let xml = report.to_string().map_err(|e| Error::Internal(format!("encoding JUnit XML: {e}")))?;
    let xml = without_root_skipped(&xml);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::write(path, xml).map_err(|e| Error::io(path, e))
}

/// quick-junit writes a `skipped` count on the root `<testsuites>`, which
/// the schema Jenkins' xUnit plugin reads (junit-10.xsd, the strictest CI
/// systems follow) does not allow there; each `<testsuite>` keeps its own.
/// Only the root's opening tag is touched.
fn without_root_skipped(xml: &str) -> String {
    let Some(start) = xml.find("<testsuites") else { return xml.to_string() };
    let Some(len) = xml[start..].find('>') else { return xml.to_string() };
    let tag = &xml[start..start + len];
    let Some(at) = tag.find(" skipped=\"") else { return xml.to_string() };
    let Some(end) = tag[at + 10..].find('"') else { return xml.to_string() };
    let mut out = String::with_capacity(xml.len());
    out.push_str(&xml[..start + at]);
    out.push_str(&xml[start + at + 10 + end + 1..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_loses_its_skipped_count_and_nothing_else() {
        let xml = "<?xml version=\"1.0\"?>\n<testsuites name=\"chaos\" tests=\"2\" skipped=\"1\" failures=\"0\" errors=\"0\">\n<testsuite name=\"s\" tests=\"2\" skipped=\"1\" failures=\"0\" errors=\"0\"/>\n</testsuites>";
        let out = without_root_skipped(xml);
        assert!(out.contains("<testsuites name=\"chaos\" tests=\"2\" failures=\"0\" errors=\"0\">"), "{out}");
        assert!(out.contains("<testsuite name=\"s\" tests=\"2\" skipped=\"1\""), "{out}");
        assert_eq!(without_root_skipped("<a/>"), "<a/>");
        let back = Report::deserialize_from_str(&out).expect("still JUnit quick-junit reads");
        assert_eq!(back.test_suites.len(), 1);
    }

    /// The kept sample report, with its verdict and first invariant changed.
    fn sample(verdict: &str, break_first: bool) -> RunReport {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../reports/sample-payments-postgres-kafka.json")).unwrap();
        v["verdict"] = verdict.into();
        v["reason"] = "the chaos did not happen: fault relay.after_produce fired".into();
        if break_first {
            v["invariants"][0]["ok"] = false.into();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_run_that_proved_nothing_is_an_error_though_every_invariant_held() {
        let r = sample("inconclusive", false);
        let back = Report::deserialize_from_str(&for_run(&r).to_string().unwrap()).unwrap();
        let suite = &back.test_suites[0];
        assert_eq!(suite.tests, 1 + r.invariants.len() + r.chaos_checks.len());
        assert_eq!((suite.failures, suite.errors), (0, 1));
        match &suite.test_cases[0].status {
            TestCaseStatus::NonSuccess { kind: NonSuccessKind::Error, message, description, .. } => {
                assert!(message.as_ref().unwrap().as_str().starts_with("inconclusive: the chaos did not happen"));
                assert!(description.as_ref().unwrap().as_str().contains("--seed 42"));
            }
            other => panic!("{other:?}"),
        }
        let passed = Report::deserialize_from_str(&for_run(&sample("pass", false)).to_string().unwrap()).unwrap();
        assert_eq!((passed.test_suites[0].failures, passed.test_suites[0].errors), (0, 0));
        let broken = Report::deserialize_from_str(&for_run(&sample("fail", true)).to_string().unwrap()).unwrap();
        assert_eq!((broken.test_suites[0].failures, broken.test_suites[0].errors), (1, 0));
    }
}
