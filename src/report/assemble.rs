//! The report of one run, assembled before verification: what ran, what
//! the components counted, no verdict yet.

use crate::context::Stats;
use crate::domain::names::RunNames;
use crate::faults::FaultInjector;
use crate::report::{self, ComponentFigures, InfraInfo, Report, ScenarioInfo, Stages, Timings};
use crate::scenario::Scenario;
use crate::verifier::Verdict;

/// Fault firings listed one by one in the report (the counts count all).
const REPORT_FAULT_LOG: usize = 200;

/// The report before verification: what ran, what the components say, no verdict yet.
pub fn skeleton(sc: &Scenario, names: &RunNames, infra: &InfraInfo, faults: &FaultInjector, stats: &Stats) -> Report {
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
        faults: faults.summary(),
        fault_log: faults.log().into_iter().take(REPORT_FAULT_LOG).collect(),
        fired: Default::default(),
        invariants: vec![],
        chaos_checks: vec![],
        anomalies: vec![],
        components: figures(stats),
        timings: Timings::default(),
        latency_ms: None,
        stages: stages(stats),
        series: vec![],
        fault_spans_ms: crate::verifier::attribution::spans(sc),
        stories: vec![],
        system: None,
        cross_check: None,
        verdict: Verdict::Incomplete,
        reason: String::new(),
    }
}

fn stages(s: &Stats) -> Stages {
    let first = |a: &std::sync::atomic::AtomicU64| match Stats::get(a) {
        u64::MAX => 0,
        v => v,
    };
    Stages {
        first_write_ms: first(&s.first_write_ms),
        last_write_ms: Stats::get(&s.last_write_ms),
        first_publish_ms: first(&s.first_publish_ms),
        last_publish_ms: Stats::get(&s.last_publish_ms),
        first_apply_ms: first(&s.first_apply_ms),
        last_apply_ms: Stats::get(&s.last_apply_ms),
    }
}

fn figures(s: &Stats) -> ComponentFigures {
    ComponentFigures {
        messages_published: Stats::get(&s.messages_published),
        relay_batches: Stats::get(&s.relay_batches),
        relay_crashes: Stats::get(&s.relay_crashes),
        relay_errors: Stats::get(&s.relay_errors),
        events_applied: Stats::get(&s.events_applied),
        duplicates_absorbed: Stats::get(&s.duplicates_absorbed),
        stale_ignored: Stats::get(&s.stale_ignored),
        dead_lettered: Stats::get(&s.dead_lettered),
        notifier_crashes: Stats::get(&s.notifier_crashes),
        notifier_errors: Stats::get(&s.notifier_errors),
        purged_outbox_rows: Stats::get(&s.purged_outbox),
        purged_inbox_rows: Stats::get(&s.purged_inbox),
        processes_started: Stats::get(&s.processes_started),
        processes_killed: Stats::get(&s.processes_killed),
        processes_paused: Stats::get(&s.processes_paused),
        sessions_at_kill: Stats::get(&s.sessions_at_kill),
        sessions_gone_after_kill: Stats::get(&s.sessions_gone_after_kill),
        commits_written: Stats::get(&s.commits_written),
        commits_empty: Stats::get(&s.commits_empty),
        waited_for_ports_ms: Stats::get(&s.waited_for_ports_ms),
        group_waits: Stats::get(&s.group_waits),
        random_kills_measured: Stats::get(&s.random_kills_measured),
        random_kills_in_transaction: Stats::get(&s.random_kills_in_transaction),
        random_kills_without_session: Stats::get(&s.random_kills_without_session),
        pauses_measured: Stats::get(&s.pauses_measured),
        pauses_in_transaction: Stats::get(&s.pauses_in_transaction),
    }
}
