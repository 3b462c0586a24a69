//! The JUnit reports of the campaigns: a test case per self-test variant,
//! or per sweep seed. A run's own is [`crate::report::junit`].

use crate::campaigns::selftest::Summary;
use crate::verifier::Verdict;
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use std::path::Path;
use std::time::Duration;

/// The JUnit report of a selftest; `reports_dir` is where its runs' reports are.
pub fn for_selftest(s: &Summary, reports_dir: &Path) -> Report {
    let mut suite = TestSuite::new("chaos selftest");
    for row in &s.rows {
        let correct = row.variant == "correct pipeline";
        let status = match row.ok {
            true => TestCaseStatus::success(),
            false => {
                let mut st = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let what = match correct {
                    true => format!("the correct pipeline was not clean: {}", row.found),
                    false => {
                        format!("not caught in {} run(s): expected {}, found {}", row.runs, row.expected, row.found)
                    }
                };
                st.set_message(what).set_type(row.expected.clone());
                let report = reports_dir.join(format!("{}.json", row.last_run));
                st.set_description(format!(
                    "fault: {}\nlast run: {} (its report, with the command that replays it: {})\n",
                    row.fault,
                    row.last_run,
                    report.display()
                ));
                st
            }
        };
        let mut case = TestCase::new(row.variant.clone(), status);
        case.set_classname(if correct { "correct pipeline" } else { "variant" });
        suite.add_test_case(case);
    }
    for name in &s.skipped {
        let mut st = TestCaseStatus::skipped();
        st.set_message("its fault needs the fault proxy, so PostgreSQL; this run has SQLite");
        let mut case = TestCase::new(name.clone(), st);
        case.set_classname("variant");
        suite.add_test_case(case);
    }
    let mut report = Report::new("chaos");
    report.add_test_suite(suite);
    report
}

/// The JUnit report of a sweep: a test case per seed run. A failing seed
/// carries its anomalies' first examples, its replay command and, when the
/// sweep shrank it, the minimal schedule's; a seed that proved nothing
/// (inconclusive, incomplete, interrupted) is an error.
pub fn for_sweep(s: &crate::campaigns::sweep::Summary) -> Report {
    let mut suite = TestSuite::new(format!("chaos sweep {}", s.scenario));
    suite.set_time(Duration::from_secs_f64(s.seconds));
    // A merge's missing shards: their seeds were never run here.
    if !s.missing_shards.is_empty() {
        let owned = s.seeds_owned();
        let count = s.merged.len() + s.missing_shards.len();
        for seed in (s.first_seed..s.first_seed + s.seeds_asked as u64).filter(|seed| !owned.contains(seed)) {
            let mut status = TestCaseStatus::skipped();
            status
                .set_message(format!("its shard's summary was not merged ({} of {count} shards were)", s.merged.len()));
            let mut case = TestCase::new(format!("seed {seed}"), status);
            case.set_classname("seed");
            suite.add_test_case(case);
        }
    }
    for r in &s.rows {
        let status = match r.verdict {
            Verdict::Pass => TestCaseStatus::success(),
            v => {
                let kind = if v == Verdict::Fail { NonSuccessKind::Failure } else { NonSuccessKind::Error };
                let mut st = TestCaseStatus::non_success(kind);
                st.set_message(format!("{}: {}", v.as_str(), r.reason)).set_type(v.as_str());
                let mut text = String::new();
                for a in &r.anomalies {
                    text.push_str(&format!("{a}\n"));
                }
                for e in &r.examples {
                    text.push_str(&format!("  {e}\n"));
                }
                text.push_str(&format!("replay: {}\nreport: {}.json\n", r.replay, r.run_id));
                if let Some(sh) = s.shrink.as_ref().filter(|sh| sh.seed == r.seed && sh.reproduced) {
                    text.push_str(&format!(
                        "shrunk to {} firing(s) and {} payments ({}): {}\nminimal replay: {}\n",
                        sh.firings.len(),
                        sh.payments,
                        sh.schedule,
                        sh.note,
                        sh.replay
                    ));
                }
                st.set_description(text);
                st
            }
        };
        let mut case = TestCase::new(format!("seed {}", r.seed), status);
        case.set_classname("seed").set_time(Duration::from_secs_f64(r.seconds));
        suite.add_test_case(case);
    }
    // The seeds asked for and never run (the sweep stopped at a failure,
    // or was interrupted) are skipped cases, so that a seed's history in
    // CI does not vanish from one sweep to the next.
    let why = if s.interrupted {
        "the sweep was interrupted"
    } else {
        "the sweep stopped at the first failure (--keep-going runs every seed)"
    };
    for seed in s.seeds_owned().into_iter().filter(|seed| !s.rows.iter().any(|r| r.seed == *seed)) {
        let mut status = TestCaseStatus::skipped();
        status.set_message(why);
        let mut case = TestCase::new(format!("seed {seed}"), status);
        case.set_classname("seed");
        suite.add_test_case(case);
    }
    let mut report = Report::new("chaos");
    report.add_test_suite(suite);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selftest_miss_is_a_failure_with_its_last_run_and_a_left_out_variant_is_skipped() {
        let row = |variant: &str, ok: bool| crate::campaigns::selftest::Row {
            variant: variant.into(),
            mistake: "m".into(),
            fault: "f 0.1".into(),
            expected: "duplicate effect".into(),
            ok,
            runs: 3,
            found: "nothing".into(),
            last_run: "20261201-000000-abcd".into(),
            core: vec![],
        };
        let s = Summary {
            rows: vec![row("inbox off", true), row("check-then-act", false), row("correct pipeline", true)],
            skipped: vec!["retry without idempotency key".into()],
            caught: 1,
            variants: 2,
            correct_clean: true,
        };
        let xml = for_selftest(&s, Path::new("reports")).to_string().unwrap();
        let back = Report::deserialize_from_str(&xml).unwrap();
        let suite = &back.test_suites[0];
        assert_eq!((suite.tests, suite.failures, suite.errors), (4, 1, 0));
        let missed = suite.test_cases.iter().find(|c| c.name.as_str() == "check-then-act").unwrap();
        match &missed.status {
            TestCaseStatus::NonSuccess { kind: NonSuccessKind::Failure, description, .. } => {
                let d = description.as_ref().unwrap().as_str();
                assert!(d.contains("reports/20261201-000000-abcd.json"), "{d}");
            }
            other => panic!("{other:?}"),
        }
        let left_out = suite.test_cases.iter().find(|c| c.name.as_str().starts_with("retry")).unwrap();
        assert!(matches!(left_out.status, TestCaseStatus::Skipped { .. }));
    }
}
