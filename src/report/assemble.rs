//! The report of one run, assembled before verification from what the run
//! recorded (its history, taken once: never the live injector): what ran,
//! what the components counted, no verdict yet.

use crate::context::Stats;
use crate::domain::names::RunNames;
use crate::faults::{FaultRecord, FaultSummary};
use crate::report::{self, InfraInfo, Report, ScenarioInfo, Stages, Timings};
use crate::scenario::Scenario;
use crate::verifier::Verdict;

/// Fault firings listed one by one in the report (the counts count all).
const REPORT_FAULT_LOG: usize = 200;

/// The report before verification: what ran, what the components say, no
/// verdict yet. `summary` and `log` are the faults as the run's history
/// holds them.
pub fn skeleton(
    sc: &Scenario,
    names: &RunNames,
    infra: &InfraInfo,
    (summary, log): (&[FaultSummary], &[FaultRecord]),
    stats: &Stats,
) -> Report {
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
        counts: Default::default(),
        faults: summary.to_vec(),
        fault_log: log.iter().take(REPORT_FAULT_LOG).cloned().collect(),
        fired: Default::default(),
        invariants: vec![],
        chaos_checks: vec![],
        anomalies: vec![],
        components: stats.counts(),
        timings: Timings::default(),
        latency_ms: None,
        stages: stages_of(stats),
        series: vec![],
        fault_spans_ms: crate::verifier::attribution::spans(sc),
        stories: vec![],
        system: None,
        verdict: Verdict::Incomplete,
        reason: String::new(),
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
