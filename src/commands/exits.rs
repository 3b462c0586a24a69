//! Every exit-code decision, in one place: what a verdict, an error, a
//! sweep, a selftest and a benchmark end with. The library returns what it
//! found; only these functions turn it into a code ([`Exit`]).

use super::exit::Exit;
use crate::campaigns::{bench, selftest, sweep};
use crate::error::Error;
use crate::verifier::Verdict;

/// A run's verdict.
pub fn of_verdict(v: Verdict) -> Exit {
    match v {
        Verdict::Pass => Exit::Pass,
        Verdict::Fail => Exit::Fail,
        Verdict::Inconclusive => Exit::Inconclusive,
        Verdict::Incomplete => Exit::Incomplete,
        Verdict::Interrupted => Exit::Interrupted,
    }
}

/// An error: bad input, a service that failed, a file that could not be
/// written, or a bug of `chaos`'s own.
pub fn of_error(e: &Error) -> Exit {
    match e {
        Error::Scenario(_) | Error::Usage(_) | Error::ReportRead { .. } => Exit::BadInput,
        Error::DatabaseUnreachable { .. }
        | Error::KafkaUnreachable { .. }
        | Error::Database { .. }
        | Error::Kafka { .. }
        | Error::Tool(_)
        | Error::Provider(_)
        | Error::Service(_) => Exit::Infra,
        Error::Write { .. } => Exit::Io,
        Error::Internal(_) => Exit::Internal,
    }
}

/// A sweep: the worst verdict decides: interrupted, then a failure, then
/// an incomplete run, then an inconclusive one.
pub fn of_sweep(s: &sweep::Summary) -> Exit {
    if s.interrupted {
        Exit::Interrupted
    } else if s.failed > 0 {
        Exit::Fail
    } else if s.incomplete > 0 {
        Exit::Incomplete
    } else if s.inconclusive > 0 {
        Exit::Inconclusive
    } else {
        Exit::Pass
    }
}

/// A selftest passes when every variant was caught and the correct
/// pipeline stayed clean.
pub fn of_selftest(s: &selftest::Summary) -> Exit {
    if s.caught == s.variants && s.correct_clean {
        Exit::Pass
    } else {
        Exit::Fail
    }
}

/// A benchmark passes when its runs' verdicts did and, unless its targets
/// are not judged (`--no-targets`), when it missed none of them: a CI job
/// that runs the bench then sees a regression, not a green job.
pub fn of_bench(f: &bench::Figures, judge_targets: bool) -> Exit {
    if f.verdict != Verdict::Pass {
        Exit::Fail
    } else if judge_targets && !f.targets_missed.is_empty() {
        Exit::TargetMissed
    } else {
        Exit::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bench_that_missed_a_target_exits_6_unless_targets_are_not_judged() {
        let mut f = bench::Figures {
            run_id: "r".into(),
            backends: "embedded".into(),
            payments: 1,
            events: 1,
            end_to_end_ms: 1,
            end_to_end_events_per_s: 1.0,
            workload_events_per_s: 1.0,
            relay_messages_per_s: 1.0,
            notifier_events_per_s: 1.0,
            verify_ms: 1,
            total_ms: 1,
            latency_ms: None,
            peak_rss_mb: 1.0,
            pgbench_tps: None,
            ratio_to_pgbench: None,
            checkpoint_before_each_run: None,
            verdict: Verdict::Pass,
            targets: vec![],
            targets_missed: vec![],
            runs: vec![],
            warmup_runs: vec![],
            process_mode: None,
            proxy_mode: None,
            emails_off_mode: None,
            emails_cpu_us: None,
        };
        assert_eq!(of_bench(&f, true), Exit::Pass);
        f.targets_missed = vec!["peak RSS ≤ 1 MB (--max-rss-mb)".into()];
        assert_eq!(of_bench(&f, true), Exit::TargetMissed);
        assert_eq!(Exit::TargetMissed.code(), 6);
        assert_eq!(of_bench(&f, false), Exit::Pass, "--no-targets");
        // A broken invariant outranks a missed target, judged or not.
        f.verdict = Verdict::Fail;
        assert_eq!(of_bench(&f, true), Exit::Fail);
        assert_eq!(of_bench(&f, false), Exit::Fail);
    }

    #[test]
    fn the_worst_verdict_decides_the_exit() {
        let mut s = crate::campaigns::sweep::Summary {
            sweep_id: "x".into(),
            scenario: "s".into(),
            backend: "b".into(),
            swarm: false,
            first_seed: 1,
            seeds_asked: 3,
            rows: vec![],
            passed: 3,
            failed: 0,
            inconclusive: 0,
            incomplete: 0,
            interrupted: false,
            shrink: None,
            seconds: 1.0,
            shard: None,
            merged: vec![],
            missing_shards: vec![],
            fingerprint: String::new(),
        };
        assert_eq!(of_sweep(&s), Exit::Pass);
        s.inconclusive = 1;
        assert_eq!(of_sweep(&s), Exit::Inconclusive);
        s.incomplete = 1;
        assert_eq!(of_sweep(&s), Exit::Incomplete);
        s.failed = 1;
        assert_eq!(of_sweep(&s), Exit::Fail);
        s.interrupted = true;
        assert_eq!(of_sweep(&s), Exit::Interrupted);
    }
}
