//! The live progress line on stderr: the run's phase, then the shared
//! counters. It only reads them (the run tells it the phase), and indicatif
//! hides it when stderr is not a terminal (CI logs stay clean).

use crate::context::Stats;
use crate::faults::FaultInjector;
use crate::report::Sample;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where a run is, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The run's schema, topic and components being made.
    Setup,
    /// Waiting for the notifiers' group to hold every partition.
    Group,
    /// The payment service writing.
    Workload,
    /// Waiting for an empty outbox and zero group lag, then the stop.
    Drain,
    /// The verifier reading the database and the topic.
    Verify,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Group => "group",
            Phase::Workload => "workload",
            Phase::Drain => "drain",
            Phase::Verify => "verify",
        }
    }
}

pub struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// `total` operations, each a `unit` ("payments", "operations"). The
    /// figures come from `latest`, the run's latest sample, once there is
    /// one: a declared system's programs count nothing for the harness, and
    /// what they published and applied is read from the broker there.
    pub fn start(
        (total, unit): (u64, &'static str),
        stats: Arc<Stats>,
        faults: Arc<FaultInjector>,
        latest: watch::Receiver<Option<Sample>>,
        visible: bool,
    ) -> Self {
        let target = if visible { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        let template =
            format!("{{spinner}} [{{elapsed_precise}}] {{prefix:8}} {{bar:30}} {{pos}}/{{len}} {unit} · {{msg}}");
        bar.set_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()));
        bar.set_prefix(Phase::Setup.name());
        let b = bar.clone();
        let task = tokio::spawn(async move {
            loop {
                b.set_position(Stats::get(&stats.payments_written));
                b.set_message(line(&stats, latest.borrow().as_ref(), faults.total_fired()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { bar, task }
    }

    /// The run moved on to `phase`.
    pub fn phase(&self, phase: Phase) {
        self.bar.set_prefix(phase.name());
    }

    /// Clears the line; dropping it does the same (a run that ends early,
    /// on an error, never leaves a line or its task behind).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// The line's figures: the latest sample's where there is one (a figure
/// the broker did not give shows as `?`, never 0), else the components'
/// counters; duplicates absorbed once the notifiers have counted one.
fn line(stats: &Stats, latest: Option<&Sample>, fired: u64) -> String {
    let shown = |n: Option<u64>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
    let (published, applied) = match latest {
        Some(s) => (shown(s.published), shown(s.applied)),
        None => (Stats::get(&stats.messages_published).to_string(), Stats::get(&stats.events_applied).to_string()),
    };
    let absorbed = match Stats::get(&stats.duplicates_absorbed) {
        0 => String::new(),
        n => format!(" · {n} duplicates absorbed"),
    };
    format!("{published} published · {applied} applied{absorbed} · {fired} faults fired")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A declared run's line shows the broker's figures, not the zeros of
    /// counters its programs never touch, and no figure it was not given.
    #[test]
    fn the_line_shows_the_latest_sample_and_no_invented_figure() {
        let stats = Stats::default();
        Stats::add(&stats.messages_published, 3);
        assert_eq!(line(&stats, None, 2), "3 published · 0 applied · 2 faults fired");
        let sample = Sample { at_ms: 0, written: 9, published: Some(246), applied: None };
        assert_eq!(line(&stats, Some(&sample), 2), "246 published · ? applied · 2 faults fired");
        Stats::add(&stats.duplicates_absorbed, 5);
        let sample = Sample { applied: Some(240), ..sample };
        assert_eq!(
            line(&stats, Some(&sample), 2),
            "246 published · 240 applied · 5 duplicates absorbed · 2 faults fired"
        );
    }
}
