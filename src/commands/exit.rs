//! Every exit code the binary returns, in one place. The README's table and
//! the `--help` text list the same codes; a test (tests/e2e/docs.rs) keeps them
//! in step with [`Exit::ALL`].

use std::process::ExitCode;

/// What a `chaos` process ended with. CI gates on these numbers, so they never
/// change meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The run met its expectations (for `run`), or the command succeeded.
    Pass = 0,
    /// The verifier found a violated invariant (or, when violations were
    /// expected, found none).
    Fail = 1,
    /// Bad input: a flag, a scenario file, a report file.
    BadInput = 2,
    /// PostgreSQL or Kafka could not be reached or used.
    Infra = 3,
    /// The run completed but its faults never fired, so it proves nothing.
    Inconclusive = 4,
    /// The pipeline did not drain in time (or a service died mid-run); the
    /// partial report is marked incomplete and no verdict is green.
    Incomplete = 5,
    /// `chaos bench`: every run's invariants held, but a target of its
    /// table was missed (`✘`); `--no-targets` makes it 0.
    TargetMissed = 6,
    /// A bug in `chaos` itself.
    Internal = 70,
    /// A report or another file could not be written (a full disk, an
    /// unwritable `--reports-dir`): the machine's fault, not `chaos`'s.
    Io = 74,
    /// Interrupted by Ctrl-C or SIGTERM; a partial report was written.
    Interrupted = 130,
}

impl Exit {
    pub const ALL: [Exit; 10] = [
        Exit::Pass,
        Exit::Fail,
        Exit::BadInput,
        Exit::Infra,
        Exit::Inconclusive,
        Exit::Incomplete,
        Exit::TargetMissed,
        Exit::Internal,
        Exit::Io,
        Exit::Interrupted,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e.code())
    }
}
