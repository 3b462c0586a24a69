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

/// A benchmark passes when its runs' verdicts did.
pub fn of_bench(f: &bench::Figures) -> Exit {
    if f.verdict == Verdict::Pass {
        Exit::Pass
    } else {
        Exit::Fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
