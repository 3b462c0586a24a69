//! Many runs at once: a sweep over seeds, the shrinker of a failing seed,
//! the self-test catalogue of classic mistakes, and the benchmark.

pub(crate) mod bench;
pub(crate) mod junit;
pub mod selftest;
pub(crate) mod shrink;
pub(crate) mod sweep;

use crate::verifier::Verdict;

/// What a campaign tells whoever shows it while it runs, in order. The
/// library emits these and prints nothing; the binary's [`Listener`]
/// (see `commands/`) shows them on stderr, as a progress bar or lines.
#[derive(Debug)]
pub enum Progress<'a> {
    /// A sweep is about to run `seeds` seeds.
    SweepStarted { seeds: u32 },
    /// A sweep's seed starts; `tally` sums the seeds before it.
    SeedStarted { seed: u64, tally: String },
    /// A sweep's seed ended.
    SeedFinished { seed: u64, verdict: Verdict, seconds: f64, reason: &'a str },
    /// Every seed of the sweep has run (the shrink, if any, comes next).
    SweepFinished,
    /// The shrinker replayed a schedule; `same` when it failed as the
    /// original did, else the replay's verdict.
    Replayed { run: u32, budget: u32, firings: usize, payments: u64, outcome: &'a str },
    /// The benchmark's next stage: pgbench, a warm-up run, a timed run.
    BenchStage { what: String },
    /// A self-test variant left out: its fault needs PostgreSQL.
    VariantLeftOut { name: &'a str },
    /// A self-test variant's run ended, caught or not.
    VariantRun { name: &'a str, run: u32, caught: bool },
    /// A clean run of the correct pipeline ended.
    CorrectRun { flavour: &'a str, seed: u64, verdict: Verdict },
}

/// Consumes a campaign's [`Progress`].
pub trait Listener: Send + Sync {
    fn progress(&self, event: &Progress<'_>);
}
