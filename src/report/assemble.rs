//! The report of one run, built once, at the end: from what the run
//! recorded (its history, taken once: never the live injector), what the
//! components counted, and what the judge found ([`Judged`]).

use crate::context::Stats;
use crate::domain::names::RunNames;
use crate::faults::{FaultRecord, FaultSummary, Schedule};
use crate::report::{self, InfraInfo, Report, ScenarioInfo, Stages, Timings};
use crate::scenario::Scenario;
use crate::verifier::latency::Latency;
use crate::verifier::reconcile::Counts;
use crate::verifier::story::Story;
use crate::verifier::{Anomaly, Invariant, Verdict};

/// The report's sections a system kind's checkers fill: the payments
/// pipeline's counts, stories and latency; a declared system's figures.
#[derive(Debug, Default)]
pub struct Sections {
    pub counts: Counts,
    pub stories: Vec<Story>,
    pub latency_ms: Option<Latency>,
    pub system: Option<crate::verifier::declared::Figures>,
}

/// What the judge found: the verdict and its reason, the firings that
/// replay the run, the faults' totals with what the checkers confirmed,
/// the invariants, chaos checks and anomalies, and the kind's sections.
/// Empty but for the verdict when the run could not be judged.
#[derive(Debug)]
pub struct Judged {
    pub verdict: Verdict,
    pub reason: String,
    pub fired: Schedule,
    pub faults: Vec<FaultSummary>,
    pub invariants: Vec<Invariant>,
    pub chaos_checks: Vec<Invariant>,
    pub anomalies: Vec<Anomaly>,
    pub sections: Sections,
}

/// Fault firings listed one by one in the report (the counts count all).
pub const REPORT_FAULT_LOG: usize = 200;

/// The whole report: what ran, what the components counted, the faults
/// as the history holds them (`log`) and the judge's findings.
pub fn build(
    sc: &Scenario,
    names: &RunNames,
    infra: &InfraInfo,
    log: &[FaultRecord],
    stats: &Stats,
    judged: Judged,
) -> Report {
    let Judged { verdict, reason, fired, faults, invariants, chaos_checks, anomalies, sections } = judged;
    Report {
        schema_version: report::SCHEMA_VERSION,
        run_id: names.run_id.clone(),
        scenario: ScenarioInfo {
            name: sc.name.clone(),
            path: sc.path.display().to_string(),
            exactly_once_expected: sc.exactly_once,
            payments: sc.payments,
            partitions: sc.partitions,
            relays: sc.relay.instances,
            notifiers: sc.notifier.instances,
            inbox: sc.notifier.inbox.as_str().into(),
            notifier_command: sc.notifier.command.as_ref().map(|c| c.shown()),
            relay_command: sc.relay.command.as_ref().map(|c| c.shown()),
        },
        seed: sc.seed,
        replay: sc.replay(),
        infra: infra.clone(),
        counts: sections.counts,
        faults,
        fault_log: log.iter().take(REPORT_FAULT_LOG).cloned().collect(),
        fired,
        invariants,
        chaos_checks,
        anomalies,
        components: stats.counts(),
        timings: Timings::default(),
        latency_ms: sections.latency_ms,
        stages: stages_of(stats),
        series: vec![],
        fault_spans_ms: crate::verifier::attribution::spans(sc),
        stories: sections.stories,
        system: sections.system,
        // The kind of system chooses its words once the report is built.
        shown: Default::default(),
        verdict,
        reason,
    }
}

/// The stage marks the components (and the series' broker reads) made.
pub fn stages_of(s: &Stats) -> Stages {
    // A stage never marked keeps its first mark at u64::MAX: it never
    // acted, and both its marks are absent.
    let stage = |first: &std::sync::atomic::AtomicU64, last: &std::sync::atomic::AtomicU64| match Stats::get(first) {
        u64::MAX => (None, None),
        f => (Some(f), Some(Stats::get(last))),
    };
    let (first_write_ms, last_write_ms) = stage(&s.first_write_ms, &s.last_write_ms);
    let (first_publish_ms, last_publish_ms) = stage(&s.first_publish_ms, &s.last_publish_ms);
    let (first_apply_ms, last_apply_ms) = stage(&s.first_apply_ms, &s.last_apply_ms);
    Stages { first_write_ms, last_write_ms, first_publish_ms, last_publish_ms, first_apply_ms, last_apply_ms }
}
